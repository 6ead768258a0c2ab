import EmbeddingKit
import XCTest

/// A stand-in for the Core ML encoder: answers each golden crop with a fixed row (the pipeline's own, or a damaged
/// copy), so the self-test's plumbing and verdicts are checked without a model.
struct FakeEmbedder: ImageEmbedder {
    let imageSize: Int
    let encoderSHA256: String
    let precision: Precision
    let answers: [[UInt8]: [Float]]

    func embed(_ image: RGBImage) async throws -> [Float] { answers[image.pixels]! }
}

final class SelfTestTests: XCTestCase {
    let set = FixtureTests.set

    func fake(_ rows: [[Float]], _ precision: Precision, sha: String? = nil) -> FakeEmbedder {
        let crops = set.manifest.queries.indices.map { set.expectedCrop($0).pixels }
        return FakeEmbedder(imageSize: set.manifest.imageSize, encoderSHA256: sha ?? set.manifest.encoderSha256, precision: precision,
                            answers: Dictionary(zip(crops, rows), uniquingKeysWith: { a, _ in a }))
    }

    func run(_ e: FakeEmbedder) async throws -> SelfTestResult {
        try await SelfTest.run(e, crops: set.manifest.queries.indices.map(set.expectedCrop), reference: set.queryEmbeddings,
                               referenceEncoder: set.manifest.encoderSha256)
    }

    func testVerdictsFollowValidatesGates() async throws {
        let exact = try await run(fake(set.queryEmbeddings, .fp32))
        XCTAssertTrue(exact.passed, "\(exact.failures)")
        let fp16 = try set.parityVariant("fp16"), noisy = try set.parityVariant("noisy")
        let fp16Result = try await run(fake(fp16, .fp16))
        XCTAssertTrue(fp16Result.passed, "\(fp16Result.failures)")
        let broken = try await run(fake(noisy, .fp16))
        XCTAssertTrue(broken.failures.contains { $0.hasPrefix("worst_rel_l2") }, "\(broken.failures)")
        let brokenFp32 = try await run(fake(noisy, .fp32))
        XCTAssertTrue(brokenFp32.failures.contains { $0.hasPrefix("max_abs") }, "\(brokenFp32.failures)")
    }

    func testGoldenRowsOfAnotherModelAreRefused() async throws {
        do {
            _ = try await run(fake(set.queryEmbeddings, .fp32, sha: String(repeating: "0", count: 64)))
            XCTFail("expected otherModel")
        } catch let e as SelfTestError {
            XCTAssertEqual(e, .otherModel(golden: set.manifest.encoderSha256, model: String(repeating: "0", count: 64)))
        }
    }
}
