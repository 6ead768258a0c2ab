// The real model on the golden crops, with validate's gates — on a Mac only (Core ML does not exist on Linux; there
// this file compiles to nothing). Point EMBEDDINGKIT_EXPORT_DIR at a run's export/ folder whose encoder.pt made the
// committed fixtures (`make swift-fixtures` on that run), e.g.
//   EMBEDDINGKIT_EXPORT_DIR=$PWD/../runs/default/export swift test
// Without it the tests are skipped, saying why.
#if canImport(CoreML)
import CoreML
import EmbeddingKit
@testable import EmbeddingKitApple
import XCTest

final class CoreMLEncoderTests: XCTestCase {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("EmbeddingKitTests/Fixtures")

    func exportDir() throws -> URL {
        guard let dir = ProcessInfo.processInfo.environment["EMBEDDINGKIT_EXPORT_DIR"] else {
            throw XCTSkip("set EMBEDDINGKIT_EXPORT_DIR to a run's export/ folder to run the real model")
        }
        return URL(fileURLWithPath: dir)
    }

    func compiled(_ name: String) async throws -> ImportedModel {
        let source = try exportDir().appendingPathComponent(name)
        guard FileManager.default.fileExists(atPath: source.path) else { throw XCTSkip("\(source.path) does not exist") }
        let store = try ModelStore(directory: FileManager.default.temporaryDirectory.appendingPathComponent("ekapple-\(UUID().uuidString)"))
        return try await store.importModel(from: source)
    }

    func selfTest(_ name: String, _ choice: ComputeChoice) async throws {
        let set = try FixtureSet(folder: Self.fixtures)
        let model = try await compiled(name)
        XCTAssertEqual(model.encoderSHA256, set.manifest.encoderSha256, "fixtures are of another encoder: run `make swift-fixtures` for this run")
        let sidecar = try EncoderSidecar.parse(Data(contentsOf: try exportDir().appendingPathComponent("encoder.json")))
        XCTAssertEqual(MetadataCheck.mismatches(model: model.metadata, sidecar: sidecar, inputNames: model.inputNames, outputNames: model.outputNames), [])
        let embedder = try CoreMLEmbedder(model, preferring: choice)
        let result = try await SelfTest.run(embedder, crops: set.manifest.queries.indices.map(set.expectedCrop),
                                            reference: set.queryEmbeddings, referenceEncoder: set.manifest.encoderSha256)
        XCTAssertTrue(result.passed, "\(name) on \(embedder.computeChoice): \(result.failures) \(result.metrics)")
    }

    func testMLPackageOnTheCPUPassesValidatesGates() async throws { try await selfTest("encoder.mlpackage", .cpuOnly) }
    func testMLPackageOnAllUnitsPassesValidatesGates() async throws { try await selfTest("encoder.mlpackage", .all) }
    func testMLModelOnTheCPUPassesValidatesGates() async throws { try await selfTest("encoder.mlmodel", .cpuOnly) }
    func testMLModelOnAllUnitsPassesValidatesGates() async throws { try await selfTest("encoder.mlmodel", .all) }

    func testVisionCenterCropIsCloseToThePipelinesCrop() async throws {
        let set = try FixtureSet(folder: Self.fixtures)
        let model = try await compiled("encoder.mlpackage")
        let vision = try VisionEmbedder(model, preferring: .cpuOnly)
        let direct = try CoreMLEmbedder(model, preferring: .cpuOnly)
        // The identity-size query: Vision has nothing to resample, so both paths must agree to fp16 tolerance.
        let i = set.manifest.queries.firstIndex { $0.width == set.manifest.imageSize && $0.height == set.manifest.imageSize && $0.layout == .rgb }!
        let crop = set.expectedCrop(i)
        let viaVision = try await vision.embed(crop)  // through the same protocol as the direct encoder
        let viaCrop = try await direct.embed(crop)
        XCTAssertGreaterThan(Vectors.cosine(viaVision, viaCrop), 0.999)
    }
}
#endif
