import EmbeddingKit
import Foundation
import XCTest

final class ZipTests: XCTestCase {
    let samples = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("ZipSamples")

    func testAZippedPackageListsAndExtractsItsStoredEntries() throws {
        let zip = try ZipArchive(data: Data(contentsOf: samples.appendingPathComponent("model.zip")))
        XCTAssertEqual(zip.entries.map(\.name), ["encoder.mlpackage/", "encoder.mlpackage/Manifest.json", "encoder.mlpackage/Data/weights.bin"])
        let manifest = try zip.contents(of: zip.entries[1], inflate: ZipArchive.storedOnly)
        XCTAssertEqual(String(decoding: manifest, as: UTF8.self), "{\"fileFormatVersion\": \"1.0.0\"}\n")
        // Deflated entries need the platform's inflater (Compression on Apple); without one: an error, never garbage.
        XCTAssertThrowsError(try zip.contents(of: zip.entries[2], inflate: ZipArchive.storedOnly))
        // An inflater that returns wrong bytes is caught by the CRC.
        XCTAssertThrowsError(try zip.contents(of: zip.entries[2]) { _, n in Data(count: n) }) {
            XCTAssertEqual($0 as? ZipError, .corrupt("encoder.mlpackage/Data/weights.bin fails its CRC-32"))
        }
    }

    func testEscapingNamesAndNonZipsAreRefused() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ekzip-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let zip = try ZipArchive(data: Data(contentsOf: samples.appendingPathComponent("escape.zip")))
        XCTAssertThrowsError(try zip.extract(into: dir, inflate: ZipArchive.storedOnly)) { XCTAssertEqual($0 as? ZipError, .unsafePath("../evil.txt")) }
        XCTAssertThrowsError(try ZipArchive(data: Data("not a zip at all, just some text".utf8))) { XCTAssertEqual($0 as? ZipError, .notAZip) }
    }
}

final class ModelInArchiveTests: XCTestCase {
    let samples = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("ZipSamples")

    func testAFinderZipGivesThePackageNotItsMacOSXTwin() throws {
        let zip = try ZipArchive(data: Data(contentsOf: samples.appendingPathComponent("finder.zip")))
        let names = zip.entries.map(\.name)
        // The sample is laid out so that the first entry named like a model is the resource-fork twin.
        XCTAssertTrue(names.first { ModelInArchive.extensions.contains(URL(fileURLWithPath: $0).pathExtension) }!.hasPrefix("__MACOSX/"))
        XCTAssertEqual(try ModelInArchive.root(names), "encoder.mlpackage")
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ekmodel-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let model = try zip.extractModel(into: dir, inflate: ZipArchive.storedOnly)
        XCTAssertEqual(model, dir.appendingPathComponent("encoder.mlpackage"))
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path), ["encoder.mlpackage"])
        XCTAssertEqual(try Data(contentsOf: model.appendingPathComponent("Data/com.apple.CoreML/weights/weight.bin")), Data(0..<16))
    }

    func testTheOutermostModelIsChosenAndSeveralAreAnError() throws {
        XCTAssertEqual(try ModelInArchive.root(["export/encoder.mlpackage/Data/com.apple.CoreML/model.mlmodel", "export/encoder.mlpackage/Manifest.json"]),
                       "export/encoder.mlpackage")
        XCTAssertEqual(try ModelInArchive.root(["._encoder.mlmodel", "encoder.mlmodel"]), "encoder.mlmodel")
        XCTAssertEqual(try ModelInArchive.root(["Encoder.MLModelC/model.mil"]), "Encoder.MLModelC")
        XCTAssertNil(try ModelInArchive.root(["readme.txt", "__MACOSX/encoder.mlpackage/._Manifest.json"]))
        XCTAssertThrowsError(try ModelInArchive.root(["a.mlpackage/Manifest.json", "b.mlmodel"])) {
            XCTAssertEqual($0 as? ZipError, .severalModels(["a.mlpackage", "b.mlmodel"]))
        }
        let zip = try ZipArchive(data: Data(contentsOf: samples.appendingPathComponent("escape.zip")))
        XCTAssertThrowsError(try zip.extractModel(into: FileManager.default.temporaryDirectory, inflate: ZipArchive.storedOnly)) {
            XCTAssertEqual($0 as? ZipError, .noModel)
        }
    }
}

final class ZipTruncationTests: XCTestCase {
    func testACutZipIsACorruptZipNeverAnIndexError() throws {
        let data = try Data(contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("ZipSamples/model.zip"))
        for n in [30, 200, data.count - 30, data.count - 1] {
            XCTAssertThrowsError(try ZipArchive(data: data.prefix(n)).extract(into: FileManager.default.temporaryDirectory.appendingPathComponent("ekcut-\(UUID().uuidString)"), inflate: ZipArchive.storedOnly), "cut at \(n)") {
                XCTAssertTrue($0 is ZipError, "cut at \(n): \($0)")
            }
        }
    }
}
