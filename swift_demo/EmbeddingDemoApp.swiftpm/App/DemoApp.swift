// The app: four screens in the order a person uses them (Model, Collect, Search, Live) over one AppModel, which
// only holds what the screens show and hands every step to EmbeddingKit's DemoEngine (an actor: nothing heavy runs
// on the main actor).
#if os(iOS)
import SwiftUI
import UIKit

@main
struct EmbeddingDemoApp: App {
    @StateObject var app = AppModel()

    var body: some Scene {
        WindowGroup {
            TabView {
                ModelScreen().tabItem { Label("Model", systemImage: "cpu") }
                CollectScreen().tabItem { Label("Collect", systemImage: "photo.on.rectangle") }
                SearchScreen().tabItem { Label("Search", systemImage: "magnifyingglass") }
                LiveScreen().tabItem { Label("Live", systemImage: "camera") }
            }
            .environmentObject(app)
        }
    }
}

@MainActor
final class AppModel: ObservableObject {
    @Published var snapshot: DemoEngine.Snapshot?
    @Published var notes: [String] = []  // what the last step said
    @Published var busy: String?  // set while a step runs: the pickers are disabled
    @Published var selfTest: [String] = []
    @Published var mismatches: [String]?  // against encoder.json; [] = it matches
    @Published var threshold = 0.5  // nearest-centroid "unknown" below this cosine
    let engine: DemoEngine?
    private var thumbnails: [String: UIImage] = [:]

    init() {
        var notes: [String] = []
        var golden: FixtureSet?
        if let url = Bundle.module.url(forResource: "Golden", withExtension: nil) {
            do { golden = try FixtureSet(folder: url) } catch { notes.append("golden files unreadable: \(error)") }
        } else {
            notes.append("no golden files in the app: run swift_demo/sync_app.sh and rebuild")
        }
        do {
            let folder = try FileManager.default.url(for: .applicationSupportDirectory, in: .userDomainMask, appropriateFor: nil, create: true)
            engine = try DemoEngine(folder: folder, loader: CoreMLLoader(), decoder: ImageIODecoder(), golden: golden)
        } catch {
            engine = nil
            notes.append("cannot open the app's folder: \(error)")
        }
        self.notes = notes
        Task { await run("starting") { engine, progress in await engine.start(progress: progress) } }
    }

    /// One step on the engine: `busy` while it runs, its lines in `notes`, its error as a line, the snapshot after.
    func run(_ what: String, _ step: @escaping (DemoEngine, @escaping @Sendable (Int, Int) -> Void) async throws -> [String]) async {
        guard let engine else { return }
        busy = what
        let progress: @Sendable (Int, Int) -> Void = { [weak self] done, total in
            Task { @MainActor in self?.busy = "\(what): \(done) of \(total)" }
        }
        do { notes = try await step(engine, progress) } catch { notes = ["\(what) failed: \(error)"] }
        snapshot = await engine.snapshot
        busy = nil
    }

    func importModel(_ picked: URL) async {
        selfTest = []
        mismatches = nil
        await run("importing \(picked.lastPathComponent)") { engine, progress in
            let staged = try await ModelImport.stage(picked, into: ModelDirectory(folder: engine.stagingFolder))
            return try await engine.install(staged: staged, progress: progress)
        }
    }

    func checkSidecar(_ url: URL) async {
        let scoped = url.startAccessingSecurityScopedResource()
        defer { if scoped { url.stopAccessingSecurityScopedResource() } }
        do {
            let sidecar = try EncoderSidecar.parse(Data(contentsOf: url))
            guard let model = await engine?.model else { mismatches = ["import the model first"]; return }
            mismatches = MetadataCheck.mismatches(model: model.metadata, sidecar: sidecar, inputNames: model.inputNames, outputNames: model.outputNames)
        } catch {
            mismatches = ["\(url.lastPathComponent): \(error)"]
        }
    }

    func runSelfTest() async {
        guard let engine else { return }
        busy = "self-test"
        selfTest = await engine.selfTest()
        busy = nil
    }

    func add(_ photos: [Data], unreadable: Int, label: String) async {
        await run("adding \(photos.count) photos") { engine, progress in
            let r = try await engine.add(photos: photos, label: label, progress: progress)
            return ["stored \(r.added) photos as \(label)"] + r.failed + (unreadable > 0 ? ["\(unreadable) could not be read from the library"] : [])
        }
    }

    /// A stored photo's small JPEG, read once.
    func thumbnail(_ id: String) -> UIImage? {
        if let cached = thumbnails[id] { return cached }
        guard let engine, let image = UIImage(contentsOfFile: engine.thumbnailURL(id).path) else { return nil }
        thumbnails[id] = image
        return image
    }
}

/// The nearest stored photos, as thumbnails with their label and cosine.
struct NeighbourStrip: View {
    @EnvironmentObject var app: AppModel
    let hits: [DemoEngine.Hit]

    var body: some View {
        ScrollView(.horizontal) {
            HStack(spacing: 8) {
                ForEach(hits, id: \.id) { hit in
                    VStack(spacing: 2) {
                        if let image = app.thumbnail(hit.id) {
                            Image(uiImage: image).resizable().scaledToFill().frame(width: 72, height: 72).clipped()
                        } else {
                            Color.gray.frame(width: 72, height: 72)
                        }
                        Text(hit.label).font(.caption).lineLimit(1)
                        Text(String(format: "%.3f", hit.similarity)).font(.caption2.monospacedDigit())
                    }
                    .frame(width: 72)
                }
            }
        }
    }
}

/// kNN and nearest-centroid labels of an answer.
struct AnswerText: View {
    let answer: DemoEngine.Answer

    var body: some View {
        VStack(alignment: .leading) {
            Text("kNN: \(answer.knnLabel) (\(String(format: "%.0f %%", 100 * answer.knnShare)) of the votes)").font(.title2)
            Text("centroid: \(answer.centroidLabel ?? "unknown (nearest \(answer.centroidNearest))"), cos \(String(format: "%.3f", answer.centroidCosine))")
                .foregroundStyle(answer.centroidLabel == nil ? Color.orange : Color.primary)
        }
    }
}
#endif
