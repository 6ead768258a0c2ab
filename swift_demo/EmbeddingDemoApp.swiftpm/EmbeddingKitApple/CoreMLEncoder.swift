// Core ML behind EmbeddingKit's ModelLoader: a compiled model loaded for a compute choice (falling back down the
// list when a unit cannot build its plan: swift-chat#31), its metadata read from the model description, batches
// predicted in one call, and MLComputePlan's per-operation units (iOS 17.4+) for the diagnostics.
// The model's input is an RGB *image*: a 32BGRA buffer is read by its tag, so channels cannot swap silently
// (coremltools#1843). Outputs are copied into [Float] at once: an IOSurface-backed output buffer is reused by the
// next prediction (Queryable's ImgEncoder hit the 16,384-IOSurface limit at ~15.8k retained outputs).
#if canImport(CoreML)
import CoreML
#if canImport(EmbeddingKit)
import EmbeddingKit  // in the app package these files and EmbeddingKit's are one module
#endif
import Foundation

public enum EncoderError: Error, CustomStringConvertible {
    case noUsableComputeUnit([String])
    case badOutput(String)
    case pixelBuffer(Int32)

    public var description: String {
        switch self {
        case .noUsableComputeUnit(let tries): return "the model loads on no compute unit: \(tries.joined(separator: "; "))"
        case .badOutput(let why): return "unexpected model output: \(why)"
        case .pixelBuffer(let status): return "CVPixelBufferCreate failed (\(status))"
        }
    }
}

extension ComputeChoice {
    var units: MLComputeUnits {
        switch self {
        case .all: return .all
        case .cpuAndNeuralEngine: return .cpuAndNeuralEngine
        case .cpuAndGPU: return .cpuAndGPU
        case .cpuOnly: return .cpuOnly
        }
    }
}

public struct CoreMLLoader: ModelLoader {
    public init() {}

    public func load(_ url: URL, preferring choice: ComputeChoice) async throws -> LoadedModel {
        var failures: [String] = []
        for c in choice.fallbacks {
            let config = MLModelConfiguration()
            config.computeUnits = c.units
            let model: MLModel
            do {
                model = try await MLModel.load(contentsOf: url, configuration: config)
            } catch {
                failures.append("\(c.rawValue): \(error.localizedDescription)")
                continue
            }
            let d = model.modelDescription
            let metadata = ModelMetadata(d.metadata[MLModelMetadataKey.creatorDefinedKey] as? [String: String] ?? [:])
            guard let size = metadata.int("image_size"), let sha = metadata["encoder_sha256"] else {
                throw EngineError.notAnEncoder("its metadata has no image_size / encoder_sha256")
            }
            let precision = Precision.of(metadata, cpuOnly: c == .cpuOnly)
            let embedder = CoreMLEmbedder(model: model, imageSize: size, encoderSHA256: sha, precision: precision,
                                          inputName: metadata["input_name"] ?? "image", outputName: metadata["output_name"] ?? "embedding")
            return LoadedModel(url: url, metadata: metadata, inputNames: d.inputDescriptionsByName.keys.sorted(),
                               outputNames: d.outputDescriptionsByName.keys.sorted(), embedder: embedder, computeChoice: c)
        }
        throw EncoderError.noUsableComputeUnit(failures)
    }

    public func plan(_ url: URL, for choice: ComputeChoice) async throws -> [OpPlacement]? {
        guard #available(iOS 17.4, macOS 14.4, *) else { return nil }
        let config = MLModelConfiguration()
        config.computeUnits = choice.units
        let plan = try await MLComputePlan.load(contentsOf: url, configuration: config)
        return Self.placements(plan, plan.modelStructure)
    }

    @available(iOS 17.4, macOS 14.4, *)
    static func placements(_ plan: MLComputePlan, _ structure: MLModelStructure) -> [OpPlacement] {
        func unit(_ d: MLComputeDevice) -> ComputeUnitKind? {
            switch d {
            case .cpu: return .cpu
            case .gpu: return .gpu
            case .neuralEngine: return .neuralEngine
            @unknown default: return nil
            }
        }
        func walk(_ block: MLModelStructure.Program.Block) -> [OpPlacement] {
            block.operations.flatMap { op -> [OpPlacement] in
                let usage = plan.deviceUsage(for: op)
                return [OpPlacement(op: op.operatorName, preferred: usage.flatMap { unit($0.preferred) },
                                    supported: usage?.supported.compactMap(unit) ?? [], cost: plan.estimatedCost(of: op)?.weight)]
                    + op.blocks.flatMap(walk)
            }
        }
        switch structure {
        case .program(let program):
            return program.functions.keys.sorted().flatMap { walk(program.functions[$0]!.block) }
        case .neuralNetwork(let network):
            return network.layers.map { layer in
                let usage = plan.deviceUsage(for: layer)
                return OpPlacement(op: layer.type, preferred: usage.flatMap { unit($0.preferred) }, supported: usage?.supported.compactMap(unit) ?? [])
            }
        case .pipeline(let pipeline):
            return pipeline.subModels.flatMap { placements(plan, $0) }
        default:
            return []
        }
    }
}

/// The synchronous prediction calls are not safe to make from two threads at once (Core ML's async prediction,
/// iOS 17, is): the live screen and a photo batch share this encoder, so calls take `lock`.
public final class CoreMLEmbedder: ImageEmbedder, @unchecked Sendable {
    public let imageSize: Int
    public let encoderSHA256: String
    public let precision: Precision
    let model: MLModel
    let inputName: String
    let outputName: String
    let lock = NSLock()

    init(model: MLModel, imageSize: Int, encoderSHA256: String, precision: Precision, inputName: String, outputName: String) {
        self.model = model
        self.imageSize = imageSize
        self.encoderSHA256 = encoderSHA256
        self.precision = precision
        self.inputName = inputName
        self.outputName = outputName
    }

    public func embed(_ image: RGBImage) async throws -> [Float] {
        try vector(try predict(try features(image)))
    }

    public func embed(batch: [RGBImage]) async throws -> [[Float]] {
        let out = try predict(batch: MLArrayBatchProvider(array: try batch.map(features)))
        return try (0..<out.count).map { try vector(out.features(at: $0)) }
    }

    // Synchronous on purpose: in an async function `model.prediction(from:)` would resolve to iOS 17's async
    // overload, and NSLock is not for async contexts.
    func predict(_ input: MLFeatureProvider) throws -> MLFeatureProvider {
        try lock.withLock { try model.prediction(from: input) }
    }

    func predict(batch: MLBatchProvider) throws -> MLBatchProvider {
        try lock.withLock { try model.predictions(fromBatch: batch) }
    }

    func features(_ image: RGBImage) throws -> MLFeatureProvider {
        try MLDictionaryFeatureProvider(dictionary: [inputName: MLFeatureValue(pixelBuffer: try PixelBuffers.bgra(image))])
    }

    /// The values, copied now, whatever the array's type and strides.
    func vector(_ output: MLFeatureProvider) throws -> [Float] {
        guard let a = output.featureValue(for: outputName)?.multiArrayValue else { throw EncoderError.badOutput("no \(outputName)") }
        let n = a.count
        if a.dataType == .float32, a.strides.last?.intValue == 1 {
            return a.withUnsafeBufferPointer(ofType: Float.self) { Array($0.prefix(n)) }
        }
        let last = a.shape.count - 1
        return (0..<n).map { i in
            var index = [NSNumber](repeating: 0, count: a.shape.count)
            index[last] = NSNumber(value: i)
            return a[index].floatValue
        }
    }
}
#endif
