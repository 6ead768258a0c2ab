// The model through Vision, as most iOS apps run it: Vision scales and crops the photo or frame itself. Its crop is
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

public final class VisionEmbedder: @unchecked Sendable {  // the request is used under `lock`
    let request: VNCoreMLRequest
    let lock = NSLock()

    public init(model: MLModel) throws {
        request = VNCoreMLRequest(model: try VNCoreMLModel(for: model))  // one shared VNCoreMLModel
        request.imageCropAndScaleOption = .centerCrop
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
