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

    func testACutHeaderIsRefusedAndACutFrameIsDroppedNeverMisread() throws {
        let index = try sample()
        let data = index.serialized()
        let frameEnds = (0...index.records.count).map { n -> Int in
            var part = EmbeddingIndex(dimension: 3, encoderSHA256: sha)
            for r in index.records.prefix(n) { try! part.add(r) }
            return part.serialized().count
        }
        XCTAssertEqual(frameEnds.first, EmbeddingIndex.headerSize)
        for n in 0..<data.count {
            if n < EmbeddingIndex.headerSize {
                XCTAssertThrowsError(try EmbeddingIndex.parse(data.prefix(n)), "cut at \(n)") {
                    guard let e = $0 as? IndexError else { return XCTFail("\($0)") }
                    switch e {
                    case .truncated, .notAnIndex: break
                    default: XCTFail("cut at \(n): \(e)")
                    }
                }
                continue
            }
            let parsed = try EmbeddingIndex.parse(data.prefix(n))
            let whole = frameEnds.lastIndex { $0 <= n }!
            XCTAssertEqual(parsed.index.records, Array(index.records.prefix(whole)), "cut at \(n)")
            XCTAssertEqual(parsed.validLength, frameEnds[whole], "cut at \(n)")
            XCTAssertEqual(parsed.droppedBytes, n - frameEnds[whole], "cut at \(n)")
        }
        XCTAssertEqual(try EmbeddingIndex.parse(data).droppedBytes, 0)
    }

    func testADamagedFrameEndsTheValidRecordsAndADamagedHeaderIsCorrupt() throws {
        let index = try sample()
        var data = index.serialized()
        data[data.count - 10] ^= 0x01  // inside the last vector
        let parsed = try EmbeddingIndex.parse(data)
        XCTAssertEqual(parsed.index.records, Array(index.records.prefix(2)))
        XCTAssertGreaterThan(parsed.droppedBytes, 0)
        // A crash can leave the file longer, filled with zeros: zeros are never a frame (the CRC covers the length).
        XCTAssertEqual(try EmbeddingIndex.parse(index.serialized() + Data(count: 64)).index.records, index.records)
        var header = index.serialized()
        header[9] ^= 0x01  // the dimension
        XCTAssertThrowsError(try EmbeddingIndex.parse(header)) { XCTAssertEqual($0 as? IndexError, .corrupt("header checksum mismatch")) }
    }

    func testAppendsWriteExactlyTheBytesOfAWholeSave() throws {
        let url = dir.appendingPathComponent("i.ekix")
        let index = try sample()
        let file = try IndexFile(url: url, dimension: 3, encoderSHA256: sha)
        XCTAssertEqual(try Data(contentsOf: url), EmbeddingIndex(dimension: 3, encoderSHA256: sha).serialized())
        try file.append([index.records[0]])
        try file.append(Array(index.records[1...]))  // a batch is one write
        XCTAssertEqual(try Data(contentsOf: url), index.serialized())
        XCTAssertEqual(file.index.records, index.records)
        let reopened = try IndexFile(url: url, dimension: 3, encoderSHA256: sha)
        XCTAssertEqual(reopened.index.records, index.records)
        XCTAssertEqual(reopened.droppedBytes, 0)
    }

    func testATornLastAppendIsDroppedKeptAsideAndOverwrittenByTheNextAppend() throws {
        let url = dir.appendingPathComponent("i.ekix")
        let index = try sample()
        let whole = index.serialized()
        var firstTwo = EmbeddingIndex(dimension: 3, encoderSHA256: sha)
        for r in index.records.prefix(2) { try firstTwo.add(r) }
        let extra = IndexRecord(id: "late", label: "cat", vector: [0, 0.6, 0.8])
        var expected = firstTwo
        try expected.add(extra)
        for cut in (firstTwo.serialized().count + 1)..<whole.count {
            try whole.prefix(cut).write(to: url)
            let file = try IndexFile(url: url, dimension: 3, encoderSHA256: sha)
            XCTAssertEqual(file.index.records, firstTwo.records, "cut at \(cut)")
            XCTAssertEqual(file.droppedBytes, cut - firstTwo.serialized().count)
            XCTAssertEqual(try Data(contentsOf: url.appendingPathExtension("damaged")), whole.prefix(cut))
            try file.append([extra])
            XCTAssertEqual(try Data(contentsOf: url), expected.serialized(), "cut at \(cut)")
        }
    }

    func testABadRecordInABatchWritesNothing() throws {
        let url = dir.appendingPathComponent("i.ekix")
        let file = try IndexFile(url: url, dimension: 3, encoderSHA256: sha)
        try file.append([IndexRecord(id: "a", label: "cat", vector: [1, 0, 0])])
        let before = try Data(contentsOf: url)
        XCTAssertThrowsError(try file.append([IndexRecord(id: "b", label: "cat", vector: [1, 0, 0]), IndexRecord(id: "a", label: "dog", vector: [0, 1, 0])])) {
            XCTAssertEqual($0 as? IndexError, .duplicateID("a"))
        }
        XCTAssertEqual(try Data(contentsOf: url), before)
        XCTAssertEqual(file.index.records.map(\.id), ["a"])
        XCTAssertThrowsError(try IndexFile(url: url, dimension: 3, encoderSHA256: otherSha)) {
            XCTAssertEqual($0 as? IndexError, .otherModel(file: sha, expected: otherSha))
        }
        XCTAssertEqual(try Data(contentsOf: url), before)
    }

    func testWrongMagicVersionAndModelAreNamed() throws {
        var data = try sample().serialized()
        var bad = data
        bad[0] = UInt8(ascii: "X")
        XCTAssertThrowsError(try EmbeddingIndex.parse(bad)) { XCTAssertEqual($0 as? IndexError, .notAnIndex("no EKIX magic")) }
        data[4] = 1  // the format before frames
        XCTAssertThrowsError(try EmbeddingIndex.parse(data)) { XCTAssertEqual($0 as? IndexError, .unsupportedVersion(1)) }
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
