// The camera against the stored photos: permission asked (or a denied state with a way to Settings), the preview,
// and for each frame the model could take, kNN and centroid labels with the nearest stored photos as thumbnails.
// Frames come newest-only; crop, embedding and classification run on the engine, off the main actor.
#if os(iOS)
import AVFoundation
import SwiftUI
import UIKit

struct LiveScreen: View {
    @EnvironmentObject var app: AppModel
    @Environment(\.openURL) var openURL
    @State var access = CameraFrames.access
    @State var camera: CameraFrames?
    @State var loop: Task<Void, Never>?
    @State var answer: DemoEngine.Answer?
    @State var failure: String?
    @State var fps = 0.0
    @State var previewAngle = 90.0

    var body: some View {
        NavigationStack {
            VStack(spacing: 12) {
                if let message = access.blockedMessage {
                    Text(message).multilineTextAlignment(.center)
                    if access.settingsCanHelp {
                        Button("Open Settings") { openURL(URL(string: UIApplication.openSettingsURLString)!) }
                    }
                } else if let camera {
                    CameraPreview(session: camera.session, rotationAngle: previewAngle)
                        .aspectRatio(previewAngle == 90 || previewAngle == 270 ? 3 / 4 : 4 / 3, contentMode: .fit)  // VGA frames
                    if let answer {
                        AnswerText(answer: answer)
                        NeighbourStrip(hits: answer.neighbours)
                        Text(String(format: "%.1f FPS — crop %.0f ms, embed %.0f ms, classify %.0f ms", fps, answer.cropMs, answer.embedMs, answer.classifyMs))
                            .font(.footnote.monospacedDigit())
                    }
                    Button("Stop", action: stop)
                } else {
                    Button("Start the camera") { Task { await start() } }.disabled((app.snapshot?.photos ?? 0) == 0)
                    if (app.snapshot?.photos ?? 0) == 0 { Text("Store a few labelled photos first (Collect).").font(.footnote) }
                }
                if let failure { Text(failure).foregroundStyle(.red) }
                Slider(value: $app.threshold, in: 0...1) { Text("unknown below") }
                Text(String(format: "\"unknown\" below cosine %.2f", app.threshold)).font(.footnote)
            }
            .padding()
            .navigationTitle("Live")
            .onAppear {
                UIDevice.current.beginGeneratingDeviceOrientationNotifications()
                access = CameraFrames.access  // it may have changed in Settings
            }
            .onDisappear {
                stop()
                UIDevice.current.endGeneratingDeviceOrientationNotifications()
            }
            .onReceive(NotificationCenter.default.publisher(for: UIDevice.orientationDidChangeNotification)) { _ in followHold() }
        }
    }

    @MainActor func start() async {
        access = await CameraFrames.requestAccess()
        guard access == .authorized, let engine = app.engine else { return }
        let cam = CameraFrames()
        let frames: AsyncThrowingStream<LiveFrame, Error>
        do {
            frames = try cam.frames()
        } catch {
            failure = "the camera did not start: \(error)"
            return
        }
        failure = nil
        camera = cam
        followHold()
        loop = Task { @MainActor in
            let clock = ContinuousClock()
            var last = clock.now
            do {
                for try await frame in frames {
                    answer = try await engine.classify(frame: frame.pixels, orientation: frame.orientation, top: 5, threshold: app.threshold)
                    let now = clock.now
                    let d = (now - last).components
                    fps = 1 / max(Double(d.seconds) + Double(d.attoseconds) * 1e-18, 1e-6)
                    last = now
                }
            } catch {
                failure = "\(error)"
                stop()
            }
        }
    }

    @MainActor func stop() {
        loop?.cancel()
        loop = nil
        camera?.stop()
        camera = nil
    }

    /// The frames' turn and the preview's angle for how the iPad is held; kept when it lies flat.
    @MainActor func followHold() {
        let raw = UIDevice.current.orientation.rawValue
        if let turn = BackCamera.frameOrientation(deviceOrientation: raw) { camera?.orientation = turn }
        if let angle = BackCamera.previewRotationAngle(deviceOrientation: raw) { previewAngle = angle }
    }
}

/// AVCaptureVideoPreviewLayer as the view's own layer.
struct CameraPreview: UIViewRepresentable {
    let session: AVCaptureSession
    let rotationAngle: Double

    final class PreviewView: UIView {
        override class var layerClass: AnyClass { AVCaptureVideoPreviewLayer.self }
        var preview: AVCaptureVideoPreviewLayer { layer as! AVCaptureVideoPreviewLayer }
    }

    func makeUIView(context: Context) -> PreviewView {
        let view = PreviewView()
        view.preview.session = session
        view.preview.videoGravity = .resizeAspectFill
        return view
    }

    func updateUIView(_ view: PreviewView, context: Context) {
        if let connection = view.preview.connection, connection.isVideoRotationAngleSupported(rotationAngle) {
            connection.videoRotationAngle = rotationAngle
        }
    }
}
#endif
