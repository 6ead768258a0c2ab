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

    /// The import path of the app: copied, compiled, staged in a models folder of its own.
    func staged(_ name: String) async throws -> URL {
        let source = try exportDir().appendingPathComponent(name)
        guard FileManager.default.fileExists(atPath: source.path) else { throw XCTSkip("\(source.path) does not exist") }
        let models = try ModelDirectory(folder: FileManager.default.temporaryDirectory.appendingPathComponent("ekapple-\(UUID().uuidString)"))
        return try await ModelImport.stage(source, into: models)
    }

    func selfTest(_ name: String, _ choice: ComputeChoice) async throws {
        let set = try FixtureSet(folder: Self.fixtures)
        let model = try await CoreMLLoader().load(try await staged(name), preferring: choice)
        XCTAssertEqual(model.embedder.encoderSHA256, set.manifest.encoderSha256, "fixtures are of another encoder: run `make swift-fixtures` for this run")
        let sidecar = try EncoderSidecar.parse(Data(contentsOf: try exportDir().appendingPathComponent("encoder.json")))
        XCTAssertEqual(MetadataCheck.mismatches(model: model.metadata, sidecar: sidecar, inputNames: model.inputNames, outputNames: model.outputNames), [])
        let result = try await SelfTest.run(model.embedder, crops: set.manifest.queries.indices.map(set.expectedCrop),
                                            reference: set.queryEmbeddings, referenceEncoder: set.manifest.encoderSha256)
        XCTAssertTrue(result.passed, "\(name) on \(model.computeChoice): \(result.failures) \(result.metrics)")
        // One batch prediction gives what single predictions give.
        let crops = Array(set.manifest.queries.indices.prefix(5).map(set.expectedCrop))
        let batch = try await model.embedder.embed(batch: crops)
        for (crop, row) in zip(crops, batch) {
            let single = try await model.embedder.embed(crop)
            XCTAssertEqual(Parity.compare(reference: [single], output: [row])!.maxAbs, 0, accuracy: 1e-6)
        }
    }

    func testMLPackageOnTheCPUPassesValidatesGates() async throws { try await selfTest("encoder.mlpackage", .cpuOnly) }
    func testMLPackageOnAllUnitsPassesValidatesGates() async throws { try await selfTest("encoder.mlpackage", .all) }
    func testMLModelOnTheCPUPassesValidatesGates() async throws { try await selfTest("encoder.mlmodel", .cpuOnly) }
    func testMLModelOnAllUnitsPassesValidatesGates() async throws { try await selfTest("encoder.mlmodel", .all) }

    func testTheComputePlanNamesAUnitPerOperation() async throws {
        let url = try await staged("encoder.mlpackage")
        guard let ops = try await CoreMLLoader().plan(url, for: .cpuAndNeuralEngine) else {
            throw XCTSkip(ComputePlanSummary.unavailable)
        }
        let summary = ComputePlanSummary(ops)
        XCTAssertGreaterThan(summary.dispatched, 0, "\(summary.lines)")
        let cpu = try await CoreMLLoader().plan(url, for: .cpuOnly)!
        XCTAssertEqual(ComputePlanSummary(cpu).share(.cpu).ops, ComputePlanSummary(cpu).dispatched, "a CPU-only plan puts every operation on the CPU")
    }
}
#endif
