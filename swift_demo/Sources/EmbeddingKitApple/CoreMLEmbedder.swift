// The model run directly (no Vision): EmbeddingKit's crop (the pipeline's pixels, byte for byte) goes into a 32BGRA
// CVPixelBuffer — the exported model's input is an RGB *image*, so Core ML reads the buffer's tagged channel order
// (coremltools#1843: an untagged or mis-tagged ARGB/BGRA buffer swaps channels silently) — and the output is copied
// into [Float] at once: an IOSurface-backed output buffer is reused by the next prediction (Queryable's
// ImgEncoder; the 16,384-IOSurface limit bit at ~15.8k retained outputs).
#if canImport(CoreML)
import CoreML
import CoreVideo
import EmbeddingKit
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

/// Compute units to try, best first; a unit that fails to load the model (swift-chat#31: "Failed to build the model
/// execution plan ... error code: -14" on the Neural Engine) falls back to the next.
public enum ComputeChoice: String, CaseIterable, Sendable {
    case all, cpuAndNeuralEngine, cpuAndGPU, cpuOnly

    public var units: MLComputeUnits {
        switch self {
        case .all: return .all
        case .cpuAndNeuralEngine: return .cpuAndNeuralEngine
        case .cpuAndGPU: return .cpuAndGPU
        case .cpuOnly: return .cpuOnly
        }
    }

    /// `self`, then every choice after it in the list, ending with the CPU (which always exists).
    public var fallbacks: [ComputeChoice] { Array(Self.allCases.drop { $0 != self }) }

    public static func load(_ compiled: URL, preferring choice: ComputeChoice) throws -> (MLModel, ComputeChoice) {
        var failures: [String] = []
        for c in choice.fallbacks {
            let config = MLModelConfiguration()
            config.computeUnits = c.units
            do { return (try MLModel(contentsOf: compiled, configuration: config), c) } catch { failures.append("\(c.rawValue): \(error.localizedDescription)") }
        }
        throw EncoderError.noUsableComputeUnit(failures)
    }
}

public final class CoreMLEmbedder: ImageEmbedder, @unchecked Sendable {  // MLModel is thread-safe for predictions
    public let imageSize: Int
    public let encoderSHA256: String
    public let precision: Precision
    public let computeChoice: ComputeChoice
    let model: MLModel
    let inputName: String
    let outputName: String

    public init(_ imported: ImportedModel, preferring choice: ComputeChoice) throws {
        guard let size = imported.imageSize, let sha = imported.encoderSHA256 else {
            throw ModelImportError.notAnEncoder("no image_size / encoder_sha256 in its metadata")
        }
        let loaded = try ComputeChoice.load(imported.compiledURL, preferring: choice)
        model = loaded.0
        computeChoice = loaded.1
        imageSize = size
        encoderSHA256 = sha
        inputName = imported.metadata["input_name"] ?? "image"
        outputName = imported.metadata["output_name"] ?? "embedding"
        // An fp16 model anywhere, or any model off the CPU (the GPU and Neural Engine compute in fp16): fp16 gates.
        precision = imported.metadata["precision"] == "fp32" && computeChoice == .cpuOnly ? .fp32 : .fp16
    }

    public func embed(_ image: RGBImage) async throws -> [Float] {
        try embed(pixelBuffer: PixelBuffers.bgra(image))
    }

    /// A buffer already at the model's size (a camera frame goes through Vision or EmbeddingKit's crop first).
    public func embed(pixelBuffer: CVPixelBuffer) throws -> [Float] {
        let input = try MLDictionaryFeatureProvider(dictionary: [inputName: MLFeatureValue(pixelBuffer: pixelBuffer)])
        let output = try model.prediction(from: input)
        guard let array = output.featureValue(for: outputName)?.multiArrayValue else { throw EncoderError.badOutput("no \(outputName)") }
        return Self.copy(array)
    }

    /// The values, copied now, whatever the array's type and strides.
    static func copy(_ a: MLMultiArray) -> [Float] {
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

public enum PixelBuffers {
    /// 32BGRA, opaque: the layout Core ML and Vision read without conversion.
    public static func bgra(_ image: RGBImage) throws -> CVPixelBuffer {
        var buffer: CVPixelBuffer?
        let attrs = [kCVPixelBufferIOSurfacePropertiesKey: [:]] as CFDictionary
        let status = CVPixelBufferCreate(kCFAllocatorDefault, image.width, image.height, kCVPixelFormatType_32BGRA, attrs, &buffer)
        guard status == kCVReturnSuccess, let buffer else { throw EncoderError.pixelBuffer(status) }
        CVPixelBufferLockBaseAddress(buffer, [])
        defer { CVPixelBufferUnlockBaseAddress(buffer, []) }
        let row = CVPixelBufferGetBytesPerRow(buffer)
        let base = CVPixelBufferGetBaseAddress(buffer)!.assumingMemoryBound(to: UInt8.self)
        for y in 0..<image.height {
            for x in 0..<image.width {
                let s = (y * image.width + x) * 3, d = y * row + x * 4
                base[d] = image.pixels[s + 2]
                base[d + 1] = image.pixels[s + 1]
                base[d + 2] = image.pixels[s]
                base[d + 3] = 255
            }
        }
        return buffer
    }

    /// A 32BGRA buffer (a camera frame) as EmbeddingKit's PixelBuffer, rows copied with their padding.
    public static func pixels(of buffer: CVPixelBuffer) throws -> PixelBuffer {
        CVPixelBufferLockBaseAddress(buffer, .readOnly)
        defer { CVPixelBufferUnlockBaseAddress(buffer, .readOnly) }
        let w = CVPixelBufferGetWidth(buffer), h = CVPixelBufferGetHeight(buffer), row = CVPixelBufferGetBytesPerRow(buffer)
        guard CVPixelBufferGetPixelFormatType(buffer) == kCVPixelFormatType_32BGRA, let base = CVPixelBufferGetBaseAddress(buffer) else {
            throw PixelError.badBuffer("expected a 32BGRA pixel buffer")
        }
        let bytes = [UInt8](UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self), count: row * h))
        return try PixelBuffer(width: w, height: h, layout: .bgra, bytes: bytes, bytesPerRow: row)
    }
}
#endif
