// Four tabs, in the order a person uses them: Model (import, card, self-test), Collect, Search, Live.
#if os(iOS)
import AVFoundation
import EmbeddingKit
import EmbeddingKitApple
import PhotosUI
import SwiftUI
import UIKit
import UniformTypeIdentifiers

@main
struct EmbeddingDemoApp: App {
    @StateObject var app = AppModel()

    var body: some Scene {
        WindowGroup {
            TabView {
                ModelTab().tabItem { Label("Model", systemImage: "cpu") }
                CollectTab().tabItem { Label("Collect", systemImage: "photo.on.rectangle") }
                SearchTab().tabItem { Label("Search", systemImage: "magnifyingglass") }
                LiveTab().tabItem { Label("Live", systemImage: "camera") }
            }
            .environmentObject(app)
        }
    }
}

let modelTypes: [UTType] = ["mlmodel", "mlpackage", "mlmodelc"].compactMap { UTType(filenameExtension: $0) } + [.zip]

struct ModelTab: View {
    @EnvironmentObject var app: AppModel
    @State var pickModel = false
    @State var pickSidecar = false
    @State var photo: PhotosPickerItem?

    var body: some View {
        NavigationStack {
            List {
                Section("Model") {
                    Button("Import a model (.mlmodel, zipped .mlpackage, .mlmodelc)") { pickModel = true }
                    if let model = app.model {
                        ForEach(model.metadata.card, id: \.0) { key, value in LabeledContent(key, value: value) }
                    }
                    Button("Check against encoder.json") { pickSidecar = true }.disabled(app.model == nil)
                    if app.sidecarName != nil && app.mismatches.isEmpty { Text("matches \(app.sidecarName!)").foregroundStyle(.green) }
                    ForEach(app.mismatches, id: \.self) { Text($0).foregroundStyle(.red) }
                }
                Section("Self-test: golden crops on each compute unit, validate's gates") {
                    PhotosPicker("Run (pick one of your photos to compare Vision with the pipeline's crop)", selection: $photo, matching: .images)
                    ForEach(app.selfTest, id: \.self) { Text($0).foregroundStyle($0.contains("FAIL") ? .red : .primary).font(.callout.monospaced()) }
                }
                if !app.status.isEmpty { Text(app.status).font(.footnote) }
            }
            .navigationTitle("Embedding Demo")
            .fileImporter(isPresented: $pickModel, allowedContentTypes: modelTypes) { result in
                if case .success(let url) = result { Task { @MainActor in await app.importModel(url) } }
            }
            .fileImporter(isPresented: $pickSidecar, allowedContentTypes: [.json]) { result in
                if case .success(let url) = result { app.importSidecar(url) }
            }
            .onChange(of: photo) { _, item in
                Task { @MainActor in
                    let data = try? await item?.loadTransferable(type: Data.self)
                    let decoded = data.flatMap(AppModel.decode)
                    await app.runSelfTest(photo: decoded?.0, orientation: decoded?.1 ?? .up)
                }
            }
        }
    }
}

struct CollectTab: View {
    @EnvironmentObject var app: AppModel
    @State var label = ""
    @State var items: [PhotosPickerItem] = []

    var body: some View {
        NavigationStack {
            Form {
                if app.needsReembed {
                    Section {
                        Text("The stored photos were embedded by another model.").foregroundStyle(.orange)
                        Button("Re-embed them with this model") { Task { @MainActor in await app.reembedAll() } }
                    }
                }
                TextField("Label for the next photos", text: $label)
                PhotosPicker("Add photos with this label", selection: $items, matching: .images).disabled(label.isEmpty || app.model == nil)
                Section("Stored") {
                    ForEach(app.classes, id: \.self) { c in
                        LabeledContent(c, value: "\(app.index?.records.filter { $0.label == c }.count ?? 0) photos")
                    }
                }
                if !app.status.isEmpty { Text(app.status).font(.footnote) }
            }
            .navigationTitle("Collect")
            .onChange(of: items) { _, picked in
                Task { @MainActor in
                    for item in picked {
                        if let data = try? await item.loadTransferable(type: Data.self) { await app.add(photo: data, label: label) }
                    }
                    items = []
                }
            }
        }
    }
}

struct SearchTab: View {
    @EnvironmentObject var app: AppModel
    @State var item: PhotosPickerItem?
    @State var hits: [(String, String, Double)] = []
    @State var answer: AppModel.Answer?

    var body: some View {
        NavigationStack {
            List {
                PhotosPicker("Pick a photo to search with", selection: $item, matching: .images).disabled(app.index == nil)
                if let a = answer {
                    Text(String(format: "kNN: %@ (%.2f)   centroid: %@ (cos %.3f)", a.knn, a.knnScore, a.centroid, a.cosine))
                }
                ForEach(hits, id: \.0) { id, label, sim in
                    HStack {
                        if let ui = UIImage(contentsOfFile: app.photosFolder.appendingPathComponent(id).path) {
                            Image(uiImage: ui).resizable().scaledToFill().frame(width: 64, height: 64).clipped()
                        }
                        Text(label)
                        Spacer()
                        Text(String(format: "%.4f", sim)).monospacedDigit()
                    }
                }
            }
            .navigationTitle("Search")
            .onChange(of: item) { _, picked in
                Task { @MainActor in
                    guard let data = try? await picked?.loadTransferable(type: Data.self), let (image, o) = AppModel.decode(data),
                          let v = try? await app.embed(image, orientation: o), let index = app.index else { return }
                    hits = ((try? index.search(v, top: 10)) ?? []).map { ($0.record.id, $0.record.label, $0.similarity) }
                    answer = app.classify(v)
                }
            }
        }
    }
}

struct LiveTab: View {
    @EnvironmentObject var app: AppModel
    @State var camera: CameraFrames?
    @State var answer: AppModel.Answer?
    @State var msPerFrame = 0.0
    @State var fps = 0.0
    @State var everyNth = 3.0

    var body: some View {
        NavigationStack {
            VStack(spacing: 16) {
                if let a = answer {
                    Text("kNN: \(a.knn)  \(String(format: "%.2f", a.knnScore))").font(.title)
                    Text("centroid: \(a.centroid)  cos \(String(format: "%.3f", a.cosine))").font(.title2)
                        .foregroundStyle(a.centroid == "unknown" ? .orange : .primary)
                }
                Text(String(format: "%.1f ms per frame, %.1f FPS (every %ldth frame)", msPerFrame, fps, Int(everyNth))).monospacedDigit()
                Slider(value: $everyNth, in: 1...10, step: 1) { Text("every Nth frame") }
                Slider(value: $app.threshold, in: 0...1) { Text("unknown below") }
                Text(String(format: "\"unknown\" below cosine %.2f", app.threshold))
                Button(camera == nil ? "Start camera" : "Stop") { camera == nil ? start() : stop() }.disabled(app.index == nil)
            }
            .padding()
            .navigationTitle("Live")
            .onDisappear { stop() }
            .onReceive(NotificationCenter.default.publisher(for: UIDevice.orientationDidChangeNotification)) { _ in
                if let o = CameraFrames.backCameraOrientation(UIDevice.current.orientation) { camera?.orientation = o }
            }
        }
    }

    @MainActor func start() {
        let cam = CameraFrames()
        cam.orientation = CameraFrames.backCameraOrientation(UIDevice.current.orientation) ?? .right
        camera = cam
        Task { @MainActor in
            guard let frames = try? cam.frames(), let vision = app.vision else { return }
            var n = 0
            var last = Date()
            for await frame in frames {  // newest frame only: a slow model skips frames, never queues them
                n += 1
                if n % Int(everyNth) != 0 { continue }
                let t0 = Date()
                let embedded = await Task.detached { try? vision.embed(frame.pixelBuffer, orientation: frame.orientation.cgOrientation) }.value
                guard let v = embedded else { continue }
                answer = app.classify(v)
                msPerFrame = Date().timeIntervalSince(t0) * 1000
                fps = 1 / max(Date().timeIntervalSince(last), 1e-6)
                last = Date()
            }
        }
    }

    @MainActor func stop() {
        camera?.stop()
        camera = nil
    }
}
#endif
