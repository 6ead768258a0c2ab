// Camera frames with back-pressure (ml-mobileclip's InferenceView): the capture output drops frames that arrive
// while the delegate is busy, and the stream keeps only the newest frame, so a slow model never builds a queue —
// the next inference always sees the latest frame. Frames come in sensor orientation; each carries the orientation
// that turns it upright; the UI sets `orientation` from the device rotation (UIDevice is main-actor only).
#if canImport(CoreML) && canImport(AVFoundation) && os(iOS)
import AVFoundation
import CoreVideo
import EmbeddingKit
import UIKit

public struct CameraFrame: @unchecked Sendable {  // CVPixelBuffer is immutable once delivered
    public let pixelBuffer: CVPixelBuffer
    public let orientation: ExifOrientation
    public let time: CMTime
}

public final class CameraFrames: NSObject, AVCaptureVideoDataOutputSampleBufferDelegate, @unchecked Sendable {
    public let session = AVCaptureSession()
    let output = AVCaptureVideoDataOutput()
    let queue = DispatchQueue(label: "camera.frames")
    var continuation: AsyncStream<CameraFrame>.Continuation?
    /// How the frames must be turned to stand upright; portrait by default.
    public var orientation: ExifOrientation = .right

    public enum CameraError: Error { case noCamera, cannotAdd }

    /// Newest frame only: `.bufferingNewest(1)`.
    public func frames() throws -> AsyncStream<CameraFrame> {
        guard let device = AVCaptureDevice.default(.builtInWideAngleCamera, for: .video, position: .back) else { throw CameraError.noCamera }
        let input = try AVCaptureDeviceInput(device: device)
        session.beginConfiguration()
        session.sessionPreset = .vga640x480  // the model sees a few hundred pixels at most
        guard session.canAddInput(input), session.canAddOutput(output) else { session.commitConfiguration(); throw CameraError.cannotAdd }
        session.addInput(input)
        output.videoSettings = [kCVPixelBufferPixelFormatTypeKey as String: kCVPixelFormatType_32BGRA]
        output.alwaysDiscardsLateVideoFrames = true
        output.setSampleBufferDelegate(self, queue: queue)
        session.addOutput(output)
        session.commitConfiguration()
        let stream = AsyncStream<CameraFrame>(bufferingPolicy: .bufferingNewest(1)) { self.continuation = $0 }
        queue.async { self.session.startRunning() }
        return stream
    }

    public func stop() {
        queue.async { self.session.stopRunning() }
        continuation?.finish()
    }

    public func captureOutput(_ output: AVCaptureOutput, didOutput sampleBuffer: CMSampleBuffer, from connection: AVCaptureConnection) {
        guard let buffer = CMSampleBufferGetImageBuffer(sampleBuffer) else { return }
        continuation?.yield(CameraFrame(pixelBuffer: buffer, orientation: orientation,
                                        time: CMSampleBufferGetPresentationTimeStamp(sampleBuffer)))
    }

    /// The back camera's sensor is landscape-left: portrait needs a quarter turn clockwise (EXIF 6). nil when the
    /// device lies flat or its rotation is unknown: keep the last one.
    public static func backCameraOrientation(_ device: UIDeviceOrientation) -> ExifOrientation? {
        switch device {
        case .portrait: return .right
        case .portraitUpsideDown: return .left
        case .landscapeLeft: return .up
        case .landscapeRight: return .down
        default: return nil
        }
    }
}
#endif
