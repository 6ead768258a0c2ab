// The model through Vision, as most iOS apps run it (an ImageEmbedder like CoreMLEmbedder, so the self-test takes either): Vision scales and crops the photo or frame itself. Its crop is
// set explicitly to .centerCrop (what the pipeline evaluates; iOS 18's CoreMLRequest defaults to scale-to-fill,
// which distorts) and the orientation is passed (camera frames arrive in sensor orientation). Vision's resampler is
// not Pillow's, so its input differs slightly from the pipeline's; the self-test measures by how much on a photo.
#if canImport(CoreML) && canImport(Vision)
import CoreML
import CoreVideo
import EmbeddingKit
import Foundation
import ImageIO
import Vision

public final class VisionEmbedder: ImageEmbedder, @unchecked Sendable {  // the request is used under `lock`
    public let imageSize: Int
    public let encoderSHA256: String
    public let precision: Precision
    public let computeChoice: ComputeChoice
    let request: VNCoreMLRequest
    let lock = NSLock()

    public init(_ imported: ImportedModel, preferring choice: ComputeChoice) throws {
        guard let size = imported.imageSize, let sha = imported.encoderSHA256 else {
            throw ModelImportError.notAnEncoder("no image_size / encoder_sha256 in its metadata")
        }
        let loaded = try ComputeChoice.load(imported.compiledURL, preferring: choice)
        request = VNCoreMLRequest(model: try VNCoreMLModel(for: loaded.0))  // one shared VNCoreMLModel
        request.imageCropAndScaleOption = .centerCrop
        imageSize = size
        encoderSHA256 = sha
        computeChoice = loaded.1
        precision = imported.metadata["precision"] == "fp32" && loaded.1 == .cpuOnly ? .fp32 : .fp16
    }

    /// The protocol's entry: a crop already at the model's size, upright (Vision has nothing left to scale).
    public func embed(_ image: RGBImage) async throws -> [Float] {
        try embed(try PixelBuffers.bgra(image), orientation: .up)
    }

    public func embed(_ image: CGImage, orientation: CGImagePropertyOrientation) throws -> [Float] {
        try run(VNImageRequestHandler(cgImage: image, orientation: orientation))
    }

    public func embed(_ frame: CVPixelBuffer, orientation: CGImagePropertyOrientation) throws -> [Float] {
        try run(VNImageRequestHandler(cvPixelBuffer: frame, orientation: orientation))
    }

    func run(_ handler: VNImageRequestHandler) throws -> [Float] {
        lock.lock()
        defer { lock.unlock() }
        try handler.perform([request])
        guard let array = (request.results?.first as? VNCoreMLFeatureValueObservation)?.featureValue.multiArrayValue else {
            throw EncoderError.badOutput("Vision returned no feature value")
        }
        return CoreMLEmbedder.copy(array)  // copied before the next perform reuses the buffer
    }
}

public extension ExifOrientation {
    var cgOrientation: CGImagePropertyOrientation { CGImagePropertyOrientation(rawValue: UInt32(rawValue))! }
}
#endif
