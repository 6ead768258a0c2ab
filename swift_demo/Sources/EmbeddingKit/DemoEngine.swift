// The iPad app's state and every step it takes, with the frameworks behind two protocols (ModelLoader: Core ML;
// PhotoDecoder: ImageIO), so that `swift test` runs the app's logic on Linux with fakes:
// - import -> verify -> swap: a new model is loaded and checked from its staged folder (the golden self-test when the
//   golden files are of its encoder, else one embedding of the right size, all finite); only then is it installed,
//   and the stored photos are re-embedded when its encoder differs from the index's;
// - index edits (photo batches, re-embeds, model swaps) run one after another, in the order they were asked for: an
//   actor alone would let a second picker batch run between the first one's awaits;
// - photos are cropped and embedded in batches of `batchSize`, each batch one batch prediction and one append;
// - crops, embeddings and classification run off the main actor (here, on the actor and the global executor);
// - camera frames and photos reach the model through the same crop, Pixels.pipelineCrop.

import Foundation

/// A compiled model, loaded: its encoder and what its description says.
public struct LoadedModel: Sendable {
    public let url: URL
    public let metadata: ModelMetadata
    public let inputNames: [String]
    public let outputNames: [String]
    public let embedder: any ImageEmbedder
    /// The compute units it loaded with (the first of the asked choice's fallbacks that loaded).
    public let computeChoice: ComputeChoice

    public init(url: URL, metadata: ModelMetadata, inputNames: [String], outputNames: [String], embedder: any ImageEmbedder,
                computeChoice: ComputeChoice) {
        self.url = url
        self.metadata = metadata
        self.inputNames = inputNames
        self.outputNames = outputNames
        self.embedder = embedder
        self.computeChoice = computeChoice
    }
}

public protocol ModelLoader: Sendable {
    /// The compiled model at `url`, loaded for `choice` or the first of its fallbacks that loads.
    func load(_ url: URL, preferring choice: ComputeChoice) async throws -> LoadedModel
    /// Core ML's planned unit per operation for `choice`; nil where the platform cannot tell.
    func plan(_ url: URL, for choice: ComputeChoice) async throws -> [OpPlacement]?
}

/// A photo file's pixels as the decoder hands them over, the EXIF orientation, and a small JPEG for the lists.
public struct DecodedPhoto: Sendable {
    public let pixels: PixelBuffer
    public let orientation: ExifOrientation
    public let thumbnail: Data?

    public init(pixels: PixelBuffer, orientation: ExifOrientation, thumbnail: Data?) {
        self.pixels = pixels
        self.orientation = orientation
        self.thumbnail = thumbnail
    }
}

public protocol PhotoDecoder: Sendable {
    func decode(_ data: Data) throws -> DecodedPhoto
}

public enum EngineError: Error, CustomStringConvertible, Equatable {
    case noModel
    case notAnEncoder(String)
    case doesNotLoad(String)
    case failedCheck([String])

    public var description: String {
        switch self {
        case .noModel: return "import a model first"
        case .notAnEncoder(let why): return "not an encoder exported by the pipeline: \(why)"
        case .doesNotLoad(let why): return "the model does not load: \(why); the installed model stays"
        case .failedCheck(let why): return "the model fails its check (\(why.joined(separator: "; "))); the installed model stays"
        }
    }
}

public actor DemoEngine {
    public struct Snapshot: Sendable {
        public let card: [(String, String)]
        public let computeChoice: ComputeChoice?
        public let photos: Int
        public let classes: [(label: String, photos: Int)]
    }

    public struct Hit: Sendable, Equatable {
        public let id: String
        public let label: String
        public let similarity: Double
    }

    public struct Answer: Sendable {
        public let knnLabel: String
        /// The winning class's share of the weighted kNN votes.
        public let knnShare: Double
        /// nil: "unknown", the nearest centroid is below the threshold.
        public let centroidLabel: String?
        public let centroidNearest: String
        public let centroidCosine: Double
        public let neighbours: [Hit]
        public let cropMs: Double
        public let embedMs: Double
        public let classifyMs: Double
    }

    public struct AddReport: Sendable, Equatable {
        public let added: Int
        public let failed: [String]
    }

    public let folder: URL
    public let batchSize: Int
    let loader: any ModelLoader
    let decoder: any PhotoDecoder
    let golden: FixtureSet?
    let models: ModelDirectory
    public private(set) var model: LoadedModel?
    var file: IndexFile? { didSet { bank = nil } }
    private var bank: LabelledBank?  // made again after every change of the index, on the next query
    private var last: Task<Void, Never>?

    /// `folder`: Application Support on the iPad (Models/, Photos/, photos.ekix); `golden`: the app's copy of the
    /// fixtures, for the self-test and the check of a new model.
    public init(folder: URL, loader: any ModelLoader, decoder: any PhotoDecoder, golden: FixtureSet?, batchSize: Int = 16) throws {
        precondition(batchSize > 0, "batchSize must be positive")
        self.folder = folder
        self.loader = loader
        self.decoder = decoder
        self.golden = golden
        self.batchSize = batchSize
        models = try ModelDirectory(folder: folder.appendingPathComponent("Models", isDirectory: true))
        try FileManager.default.createDirectory(at: photosFolder, withIntermediateDirectories: true)
    }

    public nonisolated var photosFolder: URL { folder.appendingPathComponent("Photos", isDirectory: true) }
    public nonisolated var indexURL: URL { folder.appendingPathComponent("photos.ekix") }
    public nonisolated var stagingFolder: URL { models.folder }
    public nonisolated func photoURL(_ id: String) -> URL { photosFolder.appendingPathComponent(id) }
    public nonisolated func thumbnailURL(_ id: String) -> URL { photosFolder.appendingPathComponent(id + ".thumb.jpg") }

    public var index: EmbeddingIndex? { file?.index }

    public var snapshot: Snapshot {
        let records = file?.index.records ?? []
        let counts = Dictionary(grouping: records, by: \.label).mapValues(\.count)
        return Snapshot(card: model?.metadata.card ?? [], computeChoice: model?.computeChoice, photos: records.count,
                        classes: counts.keys.sorted().map { ($0, counts[$0]!) })
    }

    /// Runs `work` after every operation asked for before it, so edits never interleave even though each awaits.
    private func serially<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) async throws -> T {
        let previous = last
        let task = Task { () async throws -> T in
            await previous?.value
            return try await work()
        }
        last = Task { _ = await task.result }
        return try await task.value
    }

    // ------------------------------------------------------------ launch, import

    /// At launch: the installed model and the photo index, re-embedded if they are of different encoders (an
    /// import interrupted after its swap). One line per thing worth saying.
    public func start(progress: (@Sendable (Int, Int) -> Void)? = nil) async -> [String] {
        do { return try await serially { await self.startNow(progress) } } catch { return ["\(error)"] }
    }

    private func startNow(_ progress: (@Sendable (Int, Int) -> Void)?) async -> [String] {
        var notes: [String] = []
        do { try models.removeStale() } catch { notes.append("old models not removed: \(error)") }
        let url: URL
        do {
            guard let installed = try models.installed() else { return notes }
            url = installed
            model = try await loader.load(url, preferring: .all)
        } catch {
            return notes + ["the installed model does not load: \(error)"]
        }
        do {
            try await verify(model!)  // also its first predictions, so the first frame is not the slow one
        } catch {
            notes.append("the installed model fails its check now: \(error)")
        }
        return notes + (await openIndexOrSay(progress))
    }

    /// Checks the staged model, installs it, re-embeds the photos if its encoder is another. Throws (and removes
    /// the staged folder) if it does not load or fails its check: the installed model stays.
    public func install(staged: URL, progress: (@Sendable (Int, Int) -> Void)? = nil) async throws -> [String] {
        try await serially { try await self.installNow(staged, progress) }
    }

    private func installNow(_ staged: URL, _ progress: (@Sendable (Int, Int) -> Void)?) async throws -> [String] {
        let candidate: LoadedModel
        do {
            candidate = try await loader.load(staged, preferring: .all)
        } catch {
            models.discard(staged)
            throw EngineError.doesNotLoad("\(error)")
        }
        do {
            try await verify(candidate)
        } catch {
            models.discard(staged)
            throw error
        }
        try models.install(staged)
        model = candidate
        file = nil
        let notes = ["installed: \(candidate.metadata["method"] ?? "?") \(candidate.metadata["backbone"] ?? "?"), encoder \(candidate.embedder.encoderSHA256.prefix(12)), on \(candidate.computeChoice.rawValue)"]
        return notes + (await openIndexOrSay(progress))
    }

    private func openIndexOrSay(_ progress: (@Sendable (Int, Int) -> Void)?) async -> [String] {
        do {
            return try await openIndex(progress)
        } catch {
            return ["the photo index is not open (\(error)): the photos are kept and re-embedded at the next launch"]
        }
    }

    /// What a model must pass before it replaces the installed one.
    func verify(_ m: LoadedModel) async throws {
        guard let size = m.metadata.int("image_size"), size > 0, let dim = m.metadata.int("embedding_dim"), dim > 0,
              let sha = m.metadata["encoder_sha256"], EmbeddingIndex.shaBytes(sha) != nil else {
            throw EngineError.notAnEncoder("its metadata needs image_size, embedding_dim and a 64-hex-digit encoder_sha256")
        }
        if let golden, golden.manifest.encoderSha256.lowercased() == sha.lowercased() {
            let r = try await SelfTest.run(m.embedder, crops: golden.manifest.queries.indices.map(golden.expectedCrop),
                                           reference: golden.queryEmbeddings, referenceEncoder: golden.manifest.encoderSha256)
            if !r.passed { throw EngineError.failedCheck(["golden crops: " + r.failures.joined(separator: ", ")]) }
            return
        }
        let gray = RGBImage(width: size, height: size, pixels: [UInt8](repeating: 128, count: size * size * 3))
        let v = try await m.embedder.embed(batch: [gray])
        guard v.count == 1, v[0].count == dim else { throw EngineError.failedCheck(["\(v.first?.count ?? 0) values, its metadata says \(dim)"]) }
        guard v[0].allSatisfy(\.isFinite), Vectors.norm(v[0]) > 0 else { throw EngineError.failedCheck(["a gray image gives a zero or non-finite embedding"]) }
    }

    /// The index of the current model: opened, or re-embedded from the stored photos if it is of another encoder.
    private func openIndex(_ progress: (@Sendable (Int, Int) -> Void)?) async throws -> [String] {
        guard let model else { return [] }
        let sha = model.embedder.encoderSHA256, dim = model.metadata.int("embedding_dim") ?? 0
        do {
            let opened = try IndexFile(url: indexURL, dimension: dim, encoderSHA256: sha)
            file = opened
            return opened.droppedBytes > 0
                ? ["the photo index's last \(opened.droppedBytes) bytes were a torn write and were dropped (kept in \(indexURL.lastPathComponent).damaged)"] : []
        } catch IndexError.otherModel, IndexError.dimensionMismatch {
            return try await reembed(progress)
        } catch {
            // Unreadable: set aside, not overwritten; the photos stay in Photos/.
            let aside = indexURL.appendingPathExtension("damaged")
            try? FileManager.default.removeItem(at: aside)
            try FileManager.default.moveItem(at: indexURL, to: aside)
            file = try IndexFile(url: indexURL, dimension: dim, encoderSHA256: sha)
            return ["the photo index could not be read (\(error)): moved to \(aside.lastPathComponent), starting empty"]
        }
    }

    /// Every stored photo embedded by the current model into a new index, which replaces the old file whole.
    private func reembed(_ progress: (@Sendable (Int, Int) -> Void)?) async throws -> [String] {
        guard let model else { throw EngineError.noModel }
        let old = try EmbeddingIndex.parse(Data(contentsOf: indexURL)).index.records
        var fresh = EmbeddingIndex(dimension: model.metadata.int("embedding_dim") ?? 0, encoderSHA256: model.embedder.encoderSHA256)
        var failed: [String] = []
        for start in stride(from: 0, to: old.count, by: batchSize) {
            let chunk = Array(old[start..<min(start + batchSize, old.count)])
            let prepared = await Self.prepare(chunk.map { r in Result(catching: { try Data(contentsOf: photoURL(r.id)) }) }, decoder,
                                              size: model.embedder.imageSize)
            let ok = zip(chunk, prepared).compactMap { r, p -> (IndexRecord, RGBImage)? in
                switch p {
                case .success(let (crop, _)): return (r, crop)
                case .failure(let e): failed.append("\(r.id): \(e)"); return nil
                }
            }
            let vectors = ok.isEmpty ? [] : try await model.embedder.embed(batch: ok.map(\.1))
            for ((r, _), v) in zip(ok, vectors) { try fresh.add(IndexRecord(id: r.id, label: r.label, vector: v)) }
            progress?(min(start + batchSize, old.count), old.count)
        }
        file = try IndexFile(url: indexURL, replacingWith: fresh)
        return ["re-embedded \(fresh.records.count) of \(old.count) photos with the new model"] + failed.map { "not re-embedded: \($0)" }
    }

    // ------------------------------------------------------------ photos

    /// Decodes, crops, embeds and stores photos under `label`, `batchSize` at a time: each batch one batch
    /// prediction and one append to the index file. A photo that cannot be read is reported and skipped.
    public func add(photos: [Data], label: String, progress: (@Sendable (Int, Int) -> Void)? = nil) async throws -> AddReport {
        try await serially { try await self.addNow(photos, label, progress) }
    }

    private func addNow(_ photos: [Data], _ label: String, _ progress: (@Sendable (Int, Int) -> Void)?) async throws -> AddReport {
        guard let model, let file else { throw EngineError.noModel }
        var added = 0
        var failed: [String] = []
        for start in stride(from: 0, to: photos.count, by: batchSize) {
            let chunk = Array(photos[start..<min(start + batchSize, photos.count)])
            let prepared = await Self.prepare(chunk.map { .success($0) }, decoder, size: model.embedder.imageSize)
            var ok: [(Data, RGBImage, Data?)] = []
            for (i, p) in prepared.enumerated() {
                switch p {
                case .success(let (crop, thumb)): ok.append((chunk[i], crop, thumb))
                case .failure(let e): failed.append("photo \(start + i + 1): \(e)")
                }
            }
            let vectors = ok.isEmpty ? [] : try await model.embedder.embed(batch: ok.map(\.1))
            var records: [IndexRecord] = []
            for ((data, _, thumb), v) in zip(ok, vectors) {
                let id = UUID().uuidString
                try data.write(to: photoURL(id), options: .atomic)  // before its record: a record never lacks its photo
                try thumb?.write(to: thumbnailURL(id), options: .atomic)
                records.append(IndexRecord(id: id, label: label, vector: v))
            }
            try file.append(records)
            bank = nil
            added += records.count
            progress?(min(start + batchSize, photos.count), photos.count)
        }
        return AddReport(added: added, failed: failed)
    }

    /// Decoded and cropped on the global executor (a static async function does not run on the actor).
    static func prepare(_ inputs: [Result<Data, Error>], _ decoder: any PhotoDecoder, size: Int) async -> [Result<(RGBImage, Data?), Error>] {
        inputs.map { input in
            Result(catching: {
                let photo = try decoder.decode(try input.get())
                return (Pixels.pipelineCrop(photo.pixels, orientation: photo.orientation, size: size), photo.thumbnail)
            })
        }
    }

    // ------------------------------------------------------------ search, live

    /// A photo's answer: decoded and cropped as stored photos are.
    public func search(photo data: Data, top: Int = 10, threshold: Double) async throws -> Answer {
        let photo = try decoder.decode(data)
        return try await answer(photo.pixels, photo.orientation, top: top, threshold: threshold)
    }

    /// A camera frame's answer: its pixel buffer (32BGRA, rows padded) through the same crop as a photo.
    public func classify(frame: PixelBuffer, orientation: ExifOrientation, top: Int = 5, threshold: Double) async throws -> Answer {
        try await answer(frame, orientation, top: top, threshold: threshold)
    }

    private func answer(_ pixels: PixelBuffer, _ orientation: ExifOrientation, top: Int, threshold: Double) async throws -> Answer {
        guard let model, let index = file?.index else { throw EngineError.noModel }
        let prepared = bank ?? LabelledBank(index)
        bank = prepared
        return try await Self.answer(pixels, orientation, model.embedder, prepared, top: top, threshold: threshold)
    }

    /// Off the actor: a batch of photos going in does not hold up the live screen.
    static func answer(_ pixels: PixelBuffer, _ orientation: ExifOrientation, _ embedder: any ImageEmbedder, _ bank: LabelledBank,
                       top: Int, threshold: Double) async throws -> Answer {
        guard !bank.isEmpty else { throw EngineError.failedCheck(["no stored photos to compare with"]) }
        let clock = ContinuousClock()
        let t0 = clock.now
        let crop = Pixels.pipelineCrop(pixels, orientation: orientation, size: embedder.imageSize)
        let t1 = clock.now
        let v = try await embedder.embed(crop)
        let t2 = clock.now
        let (knn, centroid, nearest) = bank.answer(v, top: top, threshold: threshold)
        let c = centroid!
        let t3 = clock.now
        func ms(_ d: Duration) -> Double { Double(d.components.seconds) * 1e3 + Double(d.components.attoseconds) * 1e-15 }
        return Answer(knnLabel: bank.classes[knn.label], knnShare: knn.scores[knn.label] / max(knn.scores.reduce(0, +), 1e-300),
                      centroidLabel: c.label.map { bank.classes[$0] }, centroidNearest: bank.classes[c.nearest], centroidCosine: c.cosine,
                      neighbours: nearest.map { Hit(id: bank.ids[$0.index], label: bank.classes[bank.labels[$0.index]], similarity: $0.similarity) },
                      cropMs: ms(t1 - t0), embedMs: ms(t2 - t1), classifyMs: ms(t3 - t2))
    }

    // ------------------------------------------------------------ self-test

    /// The golden crops on each compute choice with validate's gates, and where Core ML plans each operation.
    public func selfTest() async -> [String] {
        guard let model else { return [EngineError.noModel.description] }
        guard let golden else { return ["no golden files in the app: run swift_demo/sync_app.sh and rebuild"] }
        var lines: [String] = []
        for choice in [ComputeChoice.cpuOnly, .cpuAndGPU, .cpuAndNeuralEngine] {
            do {
                let m = try await loader.load(model.url, preferring: choice)
                let r = try await SelfTest.run(m.embedder, crops: golden.manifest.queries.indices.map(golden.expectedCrop),
                                               reference: golden.queryEmbeddings, referenceEncoder: golden.manifest.encoderSha256)
                let x = r.metrics
                lines.append("\(choice.rawValue) (loaded as \(m.computeChoice.rawValue), \(r.precision.rawValue) gates): "
                             + (r.passed ? "PASS" : "FAIL \(r.failures.joined(separator: ", "))")
                             + String(format: " — worst cos %.6f, worst rel L2 %.2e, top-%ld %.3f", x.worstCosine, x.worstRelL2, x.topK, x.topKAgreement ?? 0))
            } catch {
                lines.append("\(choice.rawValue): \(error)")
            }
            lines += await planLines(model.url, choice).map { "  \($0)" }
        }
        return lines
    }

    func planLines(_ url: URL, _ choice: ComputeChoice) async -> [String] {
        do {
            guard let ops = try await loader.plan(url, for: choice) else { return [ComputePlanSummary.unavailable] }
            return ComputePlanSummary(ops).lines
        } catch {
            return ["no compute plan: \(error)"]
        }
    }
}
