// The app's state: the imported model, its encoders, the stored photos and their index. Every step of README's
// "Drop the model into the iPad demo" is a method here; the views only call them.
#if os(iOS)
import CoreML
import EmbeddingKit
import EmbeddingKitApple
import Foundation
import ImageIO
import SwiftUI

@MainActor
final class AppModel: ObservableObject {
    @Published var model: ImportedModel?
    @Published var mismatches: [String] = []  // against encoder.json, shown in red
    @Published var sidecarName: String?
    @Published var selfTest: [String] = []
    @Published var index: EmbeddingIndex?
    @Published var needsReembed = false  // the stored photos were embedded by another model
    @Published var status = ""
    @Published var threshold = 0.5  // nearest-centroid "unknown" below this cosine

    let store: ModelStore
    var embedder: CoreMLEmbedder?
    var vision: VisionEmbedder?
    let folder: URL

    init() {
        folder = (try? FileManager.default.url(for: .applicationSupportDirectory, in: .userDomainMask, appropriateFor: nil, create: true))!
        store = try! ModelStore(directory: folder)
        try? FileManager.default.createDirectory(at: photosFolder, withIntermediateDirectories: true)
        Task { await loadInstalled() }
    }

    var indexURL: URL { folder.appendingPathComponent("photos.ekix") }
    var photosFolder: URL { folder.appendingPathComponent("Photos", isDirectory: true) }

    // ---------------------------------------------------------------- 1. import the model

    func loadInstalled() async {
        do {
            if let installed = try await store.installed() { try use(installed) }
        } catch { status = "\(error)" }
    }

    func importModel(_ url: URL) async {
        status = "compiling \(url.lastPathComponent) ..."
        do {
            try use(try await store.importModel(from: url))
            status = "imported \(url.lastPathComponent)"
        } catch { status = "import failed: \(error)" }
    }

    func use(_ imported: ImportedModel) throws {
        model = imported
        embedder = try CoreMLEmbedder(imported, preferring: .all)
        vision = try VisionEmbedder(imported, preferring: .all)
        selfTest = []
        openIndex()
    }

    func importSidecar(_ url: URL) {
        let scoped = url.startAccessingSecurityScopedResource()
        defer { if scoped { url.stopAccessingSecurityScopedResource() } }
        do {
            let sidecar = try EncoderSidecar.parse(Data(contentsOf: url))
            sidecarName = url.lastPathComponent
            mismatches = model.map { MetadataCheck.mismatches(model: $0.metadata, sidecar: sidecar, inputNames: $0.inputNames, outputNames: $0.outputNames) }
                ?? ["import the model first"]
        } catch { mismatches = ["\(url.lastPathComponent): \(error)"] }
    }

    // ---------------------------------------------------------------- 2. self-test

    func runSelfTest(photo: CGImage?, orientation: ExifOrientation) async {
        guard let model else { return }
        selfTest = []
        guard let goldenURL = Bundle.module.url(forResource: "Golden", withExtension: nil), let golden = try? FixtureSet(folder: goldenURL) else {
            selfTest = ["no golden set in the app: run `make swift-fixtures` for this model's run and rebuild"]
            return
        }
        let crops = golden.manifest.queries.indices.map(golden.expectedCrop)
        for choice in [ComputeChoice.cpuOnly, .cpuAndGPU, .cpuAndNeuralEngine] {
            do {
                let e = try CoreMLEmbedder(model, preferring: choice)
                let r = try await SelfTest.run(e, crops: crops, reference: golden.queryEmbeddings, referenceEncoder: golden.manifest.encoderSha256)
                let m = r.metrics
                selfTest.append("\(choice.rawValue) (ran on \(e.computeChoice.rawValue), \(r.precision.rawValue) gates): "
                                + (r.passed ? "PASS" : "FAIL \(r.failures.joined(separator: ", "))")
                                + String(format: " — worst cos %.6f, worst rel L2 %.2e, top-%ld %.3f", m.worstCosine, m.worstRelL2, m.topK, m.topKAgreement ?? 0))
            } catch {
                selfTest.append("\(choice.rawValue): \(error)")
            }
        }
        if let vision {  // the golden crops are at the model's size: Vision must pass the same gates
            do {
                let r = try await SelfTest.run(vision, crops: crops, reference: golden.queryEmbeddings, referenceEncoder: golden.manifest.encoderSha256)
                selfTest.append("Vision, centerCrop (\(vision.computeChoice.rawValue)): " + (r.passed ? "PASS" : "FAIL \(r.failures.joined(separator: ", "))"))
            } catch { selfTest.append("Vision: \(error)") }
        }
        if let photo, let embedder, let vision, let size = model.imageSize {
            do {
                let viaCrop = try await embedder.embed(try PhotoPixels.crop(photo, orientation: orientation, size: size))
                let viaVision = try vision.embed(photo, orientation: orientation.cgOrientation)
                selfTest.append(String(format: "your photo, Vision centerCrop vs the pipeline's crop: cosine %.5f", Vectors.cosine(viaCrop, viaVision)))
            } catch { selfTest.append("photo comparison: \(error)") }
        }
    }

    // ---------------------------------------------------------------- 3./6. collect photos, re-embed on a new model

    func openIndex() {
        guard let sha = embedder?.encoderSHA256, let dim = model?.metadata.int("embedding_dim") else { return }
        do {
            index = FileManager.default.fileExists(atPath: indexURL.path)
                ? try EmbeddingIndex.load(from: indexURL, expectedEncoder: sha) : EmbeddingIndex(dimension: dim, encoderSHA256: sha)
            needsReembed = false
        } catch IndexError.otherModel {
            needsReembed = true  // the file stays as it is until the user agrees to re-embed
            index = nil
        } catch { status = "photo index: \(error)" }
    }

    func embed(_ image: CGImage, orientation: ExifOrientation) async throws -> [Float] {
        guard let embedder else { throw ModelImportError.notAnEncoder("no model imported") }
        return try await embedder.embed(try PhotoPixels.crop(image, orientation: orientation, size: embedder.imageSize))
    }

    func add(photo data: Data, label: String) async {
        guard var current = index, let (image, orientation) = Self.decode(data) else { status = "not an image, or no model"; return }
        do {
            let id = UUID().uuidString
            try data.write(to: photosFolder.appendingPathComponent(id), options: .atomic)
            try current.add(IndexRecord(id: id, label: label, vector: try await embed(image, orientation: orientation)))
            try current.save(to: indexURL)
            index = current
            status = "stored (\(current.records.count) photos)"
        } catch { status = "\(error)" }
    }

    func reembedAll() async {
        guard let embedder, let dim = model?.metadata.int("embedding_dim"),
              let old = try? EmbeddingIndex.parse(Data(contentsOf: indexURL)) else { return }
        var fresh = EmbeddingIndex(dimension: dim, encoderSHA256: embedder.encoderSHA256)
        for r in old.records {
            guard let data = try? Data(contentsOf: photosFolder.appendingPathComponent(r.id)), let (image, o) = Self.decode(data),
                  let v = try? await embed(image, orientation: o) else { continue }
            try? fresh.add(IndexRecord(id: r.id, label: r.label, vector: v))
        }
        do {
            try fresh.save(to: indexURL)  // atomic: the old index stays until this one is complete
            index = fresh
            needsReembed = false
            status = "re-embedded \(fresh.records.count) of \(old.records.count) photos"
        } catch { status = "\(error)" }
    }

    // ---------------------------------------------------------------- 4./5. search, classify

    var classes: [String] { Array(Set(index?.records.map(\.label) ?? [])).sorted() }

    struct Answer {
        var knn: String, knnScore: Double, centroid: String, cosine: Double
    }

    func classify(_ v: [Float]) -> Answer? {
        guard let index, !index.records.isEmpty else { return nil }
        let classes = self.classes
        let bank = index.records.map(\.vector), labels = index.records.map { classes.firstIndex(of: $0.label)! }
        let knn = Classifiers.knn(v, bank: bank, labels: labels, classes: classes.count)
        let c = NearestCentroid(bank: bank, labels: labels, classes: classes.count, threshold: threshold).predict(v)
        return Answer(knn: classes[knn.label], knnScore: knn.scores[knn.label] / max(knn.scores.reduce(0, +), 1e-12),
                      centroid: c?.label.map { classes[$0] } ?? "unknown", cosine: c?.cosine ?? 0)
    }

    nonisolated static func decode(_ data: Data) -> (CGImage, ExifOrientation)? {
        guard let src = CGImageSourceCreateWithData(data as CFData, nil), let image = CGImageSourceCreateImageAtIndex(src, 0, nil) else { return nil }
        let props = CGImageSourceCopyPropertiesAtIndex(src, 0, nil) as? [CFString: Any]
        let raw = (props?[kCGImagePropertyOrientation] as? NSNumber)?.intValue ?? 1
        return (image, ExifOrientation(rawValue: raw) ?? .up)
    }
}
#endif
