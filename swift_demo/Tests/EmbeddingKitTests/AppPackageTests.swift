// The iPad app package holds plain copies of what it needs (Swift Playgrounds takes no local package dependency,
// and symlinks dangle once the folder is copied): these tests keep the copies identical to their sources, byte for
// byte, and the manifest free of what Playgrounds refuses. After a difference: run swift_demo/sync_app.sh.

import Foundation
import XCTest

final class AppPackageTests: XCTestCase {
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    var app: URL { root.appendingPathComponent("EmbeddingDemoApp.swiftpm") }

    /// Relative path -> bytes of every file under `folder`; symlinks are reported, never followed.
    func files(_ folder: URL) throws -> [String: Data] {
        var out: [String: Data] = [:]
        let fm = FileManager.default
        for relative in try fm.subpathsOfDirectory(atPath: folder.path) {
            let path = folder.appendingPathComponent(relative).path
            let type = try fm.attributesOfItem(atPath: path)[.type] as? FileAttributeType
            XCTAssertNotEqual(type, .typeSymbolicLink, "\(path) is a symlink: it dangles in a bundle; run sync_app.sh")
            if type == .typeRegular { out[relative] = try Data(contentsOf: URL(fileURLWithPath: path)) }
        }
        return out
    }

    func assertSameFiles(_ source: String, _ copy: String) throws {
        let want = try files(root.appendingPathComponent(source)), got = try files(app.appendingPathComponent(copy))
        XCTAssertFalse(want.isEmpty, source)
        XCTAssertEqual(got.keys.sorted(), want.keys.sorted(), "\(copy) lists other files than \(source): run swift_demo/sync_app.sh")
        for (name, bytes) in want where got[name] != bytes {
            XCTFail("EmbeddingDemoApp.swiftpm/\(copy)/\(name) differs from \(source)/\(name): run swift_demo/sync_app.sh")
        }
    }

    func testTheGoldenFilesInTheAppAreTheFixtures() throws { try assertSameFiles("Tests/EmbeddingKitTests/Fixtures", "Golden") }
    func testTheAppsEmbeddingKitIsTheLibrary() throws { try assertSameFiles("Sources/EmbeddingKit", "EmbeddingKit") }
    func testTheAppsEmbeddingKitAppleIsTheLibrary() throws { try assertSameFiles("Sources/EmbeddingKitApple", "EmbeddingKitApple") }

    func testTheManifestIsOnePlaygroundsTargetWithItsUsageStrings() throws {
        let manifest = try String(contentsOf: app.appendingPathComponent("Package.swift"), encoding: .utf8)
        let code = manifest.split(separator: "\n").filter { !$0.trimmingCharacters(in: .whitespaces).hasPrefix("//") }.joined(separator: "\n")
        XCTAssertFalse(code.contains(".package("), "Swift Playgrounds accepts no local package dependency")
        XCTAssertTrue(code.contains("#if canImport(AppleProductTypes)"), "Linux cannot import AppleProductTypes")
        XCTAssertTrue(code.contains(".camera(purposeString: \""), "NSCameraUsageDescription")
        XCTAssertTrue(code.contains(".photoLibrary(purposeString: \""), "NSPhotoLibraryUsageDescription")
        XCTAssertTrue(code.contains("resources: [.copy(\"Golden\")]"))
        XCTAssertEqual(code.components(separatedBy: ".executableTarget(").count, 2, "one target")
        // Every Swift file of the app package is guarded for a platform, so only an Apple SDK compiles it.
        for (name, bytes) in try files(app) where name.hasSuffix(".swift") && name != "Package.swift" && !name.hasPrefix("EmbeddingKit/") {
            let text = String(decoding: bytes, as: UTF8.self)
            XCTAssertTrue(text.contains("\n#if os(iOS)") || text.contains("\n#if canImport("), "\(name) has no platform guard")
        }
    }
}
