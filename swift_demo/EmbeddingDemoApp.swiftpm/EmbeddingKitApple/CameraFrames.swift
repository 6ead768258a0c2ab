// The back camera as a stream of frames, newest only (ml-mobileclip's InferenceView): the capture output drops
// frames that arrive while the delegate is busy, and the stream buffers one frame (.bufferingNewest(1)), so a slow
// model skips frames and never builds a queue. Each frame is copied out of its pixel buffer on the capture queue
// (EmbeddingKit's PixelBuffer, rows with their padding), which hands the buffer back to the capture pool at once and
// lets the frame go through the same crop as a photo. A capture failure ends the stream with its error.
#if canImport(AVFoundation) && canImport(CoreVideo) && os(iOS)
import AVFoundation
import CoreVideo
#if canImport(EmbeddingKit)
import EmbeddingKit
#endif
import Foundation

public struct LiveFrame: Sendable {
    public let pixels: PixelBuffer
    public let orientation: ExifOrientation
}

public final class CameraFrames: NSObject, AVCaptureVideoDataOutputSampleBufferDelegate, @unchecked Sendable {
    public let session = AVCaptureSession()  // configured once in frames(), then used from `queue` only
    private let output = AVCaptureVideoDataOutput()
    private let queue = DispatchQueue(label: "camera.frames")
    private let lock = NSLock()
    private var continuation: AsyncThrowingStream<LiveFrame, Error>.Continuation?
    private var turn: ExifOrientation = .right
    private var observer: NSObjectProtocol?

    public enum CameraError: Error, CustomStringConvertible {
        case noCamera, cannotAdd

        public var description: String {
            switch self {
            case .noCamera: return "this device has no back camera"
            case .cannotAdd: return "the camera cannot be added to the capture session (is another app using it?)"
            }
        }
    }

    /// How the frames must be turned to stand upright (BackCamera.frameOrientation of the device's hold).
    public var orientation: ExifOrientation {
        get { lock.withLock { turn } }
        set { lock.withLock { turn = newValue } }
    }

    public static var access: CameraAccess {
        switch AVCaptureDevice.authorizationStatus(for: .video) {
        case .authorized: return .authorized
        case .notDetermined: return .notDetermined
        case .restricted: return .restricted
        default: return .denied
        }
    }

    /// The system asks once (showing NSCameraUsageDescription); after that the answer stands until Settings changes it.
    public static func requestAccess() async -> CameraAccess {
        if access == .notDetermined { _ = await AVCaptureDevice.requestAccess(for: .video) }
        return access
    }

    public func frames() throws -> AsyncThrowingStream<LiveFrame, Error> {
        guard let device = AVCaptureDevice.default(.builtInWideAngleCamera, for: .video, position: .back) else { throw CameraError.noCamera }
        let input = try AVCaptureDeviceInput(device: device)
        session.beginConfiguration()
        if session.canSetSessionPreset(.vga640x480) { session.sessionPreset = .vga640x480 }  // the model sees a few hundred pixels
        guard session.canAddInput(input), session.canAddOutput(output) else {
            session.commitConfiguration()
            throw CameraError.cannotAdd
        }
        session.addInput(input)
        output.videoSettings = [kCVPixelBufferPixelFormatTypeKey as String: kCVPixelFormatType_32BGRA]
        output.alwaysDiscardsLateVideoFrames = true
        output.setSampleBufferDelegate(self, queue: queue)
        session.addOutput(output)
        session.commitConfiguration()
        let stream = AsyncThrowingStream<LiveFrame, Error>(bufferingPolicy: .bufferingNewest(1)) { continuation in
            lock.withLock { self.continuation = continuation }
        }
        observer = NotificationCenter.default.addObserver(forName: AVCaptureSession.runtimeErrorNotification, object: session, queue: nil) {
            [weak self] note in
            let error = note.userInfo?[AVCaptureSessionErrorKey] as? Error ?? CameraError.cannotAdd
            self?.finish(throwing: error)
        }
        queue.async { self.session.startRunning() }  // blocks until the camera runs: never on the main thread
        return stream
    }

    public func stop() {
        if let observer { NotificationCenter.default.removeObserver(observer) }
        queue.async { self.session.stopRunning() }
        finish(throwing: nil)
    }

    private func finish(throwing error: Error?) {
        let c = lock.withLock { () -> AsyncThrowingStream<LiveFrame, Error>.Continuation? in
            defer { continuation = nil }
            return continuation
        }
        c?.finish(throwing: error)
    }

    public func captureOutput(_ output: AVCaptureOutput, didOutput sampleBuffer: CMSampleBuffer, from connection: AVCaptureConnection) {
        guard let buffer = CMSampleBufferGetImageBuffer(sampleBuffer) else { return }
        do {
            let frame = LiveFrame(pixels: try PixelBuffers.pixels(of: buffer), orientation: orientation)
            _ = lock.withLock { continuation }?.yield(frame)
        } catch {
            finish(throwing: error)
        }
    }
}
#endif
