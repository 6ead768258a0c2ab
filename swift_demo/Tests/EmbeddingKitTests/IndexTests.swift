import EmbeddingKit
import Foundation
import XCTest

final class IndexTests: XCTestCase {
    let sha = String(repeating: "ab", count: 32)
    let otherSha = String(repeating: "cd", count: 32)
    var dir: URL!

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("ekindex-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    func sample() throws -> EmbeddingIndex {
        var index = EmbeddingIndex(dimension: 3, encoderSHA256: sha)
        try index.add(IndexRecord(id: "a", label: "cat", vector: [1, 0, 0]))
        try index.add(IndexRecord(id: "b", label: "dog", vector: [0.6, 0.8, 0]))
        try index.add(IndexRecord(id: "é-ü", label: "", vector: [0, 0, -1]))
        return index
    }

    func testRoundTripKeepsEveryRecordBitForBit() throws {
        let index = try sample()
        let url = dir.appendingPathComponent("i.ekix")
        try index.save(to: url)
        let back = try EmbeddingIndex.load(from: url, expectedEncoder: sha.uppercased())
        XCTAssertEqual(back.records, index.records)
        XCTAssertEqual(back.dimension, 3)
        XCTAssertEqual(back.encoderSHA256, sha)
        XCTAssertEqual(try back.search([1, 0.1, 0], top: 2).map(\.record.id), ["a", "b"])
    }

    func testEveryTruncationIsRefusedAsTruncatedOrCorrupt() throws {
        let data = try sample().serialized()
        for n in 0..<data.count {
            XCTAssertThrowsError(try EmbeddingIndex.parse(data.prefix(n)), "cut at \(n)") { error in
                guard let e = error as? IndexError else { return XCTFail("\(error)") }
                switch e {
                case .truncated, .notAnIndex: break
                default: if n >= 4 { XCTFail("cut at \(n): \(e)") }
                }
            }
        }
        XCTAssertThrowsError(try EmbeddingIndex.parse(data.prefix(data.count - 8))) { XCTAssertEqual(String(describing: $0).hasPrefix("index file is truncated"), true) }
    }

    func testAFlippedByteIsCorrupt() throws {
        var data = try sample().serialized()
        data[data.count - 10] ^= 0x01  // inside the last vector
        XCTAssertThrowsError(try EmbeddingIndex.parse(data)) { XCTAssertEqual($0 as? IndexError, .corrupt("checksum mismatch")) }
    }

    func testWrongMagicVersionAndModelAreNamed() throws {
        var data = try sample().serialized()
        var bad = data
        bad[0] = UInt8(ascii: "X")
        XCTAssertThrowsError(try EmbeddingIndex.parse(bad)) { XCTAssertEqual($0 as? IndexError, .notAnIndex("no EKIX magic")) }
        data[4] = 2  // version 2
        XCTAssertThrowsError(try EmbeddingIndex.parse(data)) { XCTAssertEqual($0 as? IndexError, .unsupportedVersion(2)) }
        XCTAssertThrowsError(try EmbeddingIndex.parse(try sample().serialized(), expectedEncoder: otherSha)) {
            XCTAssertEqual($0 as? IndexError, .otherModel(file: sha, expected: otherSha))
            XCTAssertTrue(String(describing: $0).contains("re-embed"))
        }
    }

    func testAFailedLoadLeavesTheFileAsItWas() throws {
        let url = dir.appendingPathComponent("i.ekix")
        try sample().save(to: url)
        let before = try Data(contentsOf: url)
        XCTAssertThrowsError(try EmbeddingIndex.load(from: url, expectedEncoder: otherSha))
        XCTAssertEqual(try Data(contentsOf: url), before)
        // A save replaces the file whole and leaves no temp file beside it.
        var grown = try EmbeddingIndex.load(from: url)
        try grown.add(IndexRecord(id: "c", label: "cat", vector: [0, 1, 0]))
        try grown.save(to: url)
        XCTAssertEqual(try EmbeddingIndex.load(from: url).records.count, 4)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path), ["i.ekix"])
    }

    func testBadRecordsAreRefusedAndNothingStoredIsLost() throws {
        var index = try sample()
        XCTAssertThrowsError(try index.add(IndexRecord(id: "x", label: "cat", vector: [1, 2]))) {
            XCTAssertEqual($0 as? IndexError, .dimensionMismatch(expected: 3, got: 2))
        }
        XCTAssertThrowsError(try index.add(IndexRecord(id: "a", label: "cat", vector: [1, 2, 3]))) {
            XCTAssertEqual($0 as? IndexError, .duplicateID("a"))
        }
        XCTAssertEqual(index.records, try sample().records)
        XCTAssertThrowsError(try index.search([1, 2], top: 1))
    }
}
