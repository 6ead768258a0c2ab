// The app's self-test, platform-free: golden crops (pixels the pipeline cropped) and the pipeline's fp32 embeddings
// of them, run through whatever encoder the device has, judged by `pipeline validate`'s gates. The Core ML and
// Vision encoders (EmbeddingKitApple) and the tests' fakes all sit behind `ImageEmbedder`.

import Foundation

/// Anything that turns the model's S x S RGB input into an embedding.
public protocol ImageEmbedder: Sendable {
    var imageSize: Int { get }
    /// sha256 of the encoder.pt the model was exported from (its metadata's `encoder_sha256`).
    var encoderSHA256: String { get }
    /// The precision whose gates apply (`Precision.of`): compressed for `--compress` weights, fp16 for an fp16 model
    /// or any run on the GPU / Neural Engine.
    var precision: Precision { get }
    func embed(_ image: RGBImage) async throws -> [Float]
    /// Several inputs in one call (Core ML's batch prediction); one by one unless the encoder does better.
    func embed(batch: [RGBImage]) async throws -> [[Float]]
}

extension ImageEmbedder {
    public func embed(batch: [RGBImage]) async throws -> [[Float]] {
        var out: [[Float]] = []
        for image in batch { out.append(try await embed(image)) }
        return out
    }
}

public struct SelfTestResult: Sendable {
    public let metrics: ParityMetrics
    public let precision: Precision
    public let failures: [String]
    public var passed: Bool { failures.isEmpty }
}

public enum SelfTestError: Error, CustomStringConvertible, Equatable {
    case otherModel(golden: String, model: String)
    case sizeMismatch(golden: Int, model: Int)
    case empty

    public var description: String {
        switch self {
        case .otherModel(let golden, let model):
            return "the golden embeddings are of encoder \(golden.prefix(12)), the model is \(model.prefix(12)): they cannot judge it"
        case .sizeMismatch(let golden, let model): return "golden crops are \(golden) px, the model takes \(model) px"
        case .empty: return "no golden crops"
        }
    }
}

public enum SelfTest {
    public static func run(_ embedder: ImageEmbedder, crops: [RGBImage], reference: [[Float]], referenceEncoder: String,
                           gates: ParityGates = ParityGates()) async throws -> SelfTestResult {
        guard !crops.isEmpty, crops.count == reference.count else { throw SelfTestError.empty }
        guard referenceEncoder.lowercased() == embedder.encoderSHA256.lowercased() else {
            throw SelfTestError.otherModel(golden: referenceEncoder, model: embedder.encoderSHA256)
        }
        guard crops[0].width == embedder.imageSize else { throw SelfTestError.sizeMismatch(golden: crops[0].width, model: embedder.imageSize) }
        var outputs: [[Float]] = []
        for crop in crops { outputs.append(try await embedder.embed(crop)) }
        guard let m = Parity.compare(reference: reference, output: outputs, topK: gates.topK) else {
            return SelfTestResult(metrics: ParityMetrics(images: 0, worstCosine: 0, meanCosine: 0, worstRelL2: .infinity, meanRelL2: .infinity,
                                                         maxAbs: .infinity, topK: 0, topKAgreement: nil, worstImage: 0),
                                  precision: embedder.precision, failures: ["output shape differs from the reference"])
        }
        return SelfTestResult(metrics: m, precision: embedder.precision, failures: Parity.failures(m, precision: embedder.precision, gates: gates))
    }
}
