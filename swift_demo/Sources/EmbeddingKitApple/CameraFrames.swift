// Camera frames with back-pressure (ml-mobileclip's InferenceView): the capture output drops frames that arrive
// while the delegate is busy, and the stream keeps only the newest frame, so a slow model never builds a queue —
// the next inference always sees the latest frame. Frames come in sensor orientation; each carries the orientation
// that turns it upright for the current device rotation.
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
        continuation?.yield(CameraFrame(pixelBuffer: buffer, orientation: Self.backCameraOrientation(),
                                        time: CMSampleBufferGetPresentationTimeStamp(sampleBuffer)))
    }

    /// The back camera's sensor is landscape-left: portrait needs a quarter turn clockwise (EXIF 6).
    static func backCameraOrientation() -> ExifOrientation {
        switch UIDevice.current.orientation {
        case .portraitUpsideDown: return .left
        case .landscapeLeft: return .up
        case .landscapeRight: return .down
        default: return .right
        }
    }
}
#endif
