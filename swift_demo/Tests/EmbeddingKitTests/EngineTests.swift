// The app's logic (DemoEngine) with fakes behind its two protocols: photos are the fixtures' query buffers, and the
// fake encoder answers a crop only if it is byte for byte one of the pipeline's golden crops (with the pipeline's
// embedding of it), so every path that reaches the model is checked to feed it the pipeline's pixels.

import EmbeddingKit
import Foundation
import XCTest

/// A photo file's bytes are "query N": its pixels are the fixtures' query N as a decoder would hand them over.
struct FixturePhotos: PhotoDecoder {
    let set: FixtureSet

    func decode(_ data: Data) throws -> DecodedPhoto {
        guard let s = String(data: data, encoding: .utf8), s.hasPrefix("query "), let i = Int(s.dropFirst(6)),
              set.manifest.queries.indices.contains(i) else { throw FixtureError("not an image") }
        let (pixels, orientation) = try set.buffer(i)
        return DecodedPhoto(pixels: pixels, orientation: orientation, thumbnail: Data("thumbnail \(i)".utf8))
    }

    static func photo(_ i: Int) -> Data { Data("query \(i)".utf8) }
}

/// Batch sizes the fake encoders were given, across tasks.
final class BatchLog: @unchecked Sendable {
    private let lock = NSLock()
    private var sizes: [Int] = []
    func add(_ n: Int) { lock.lock(); sizes.append(n); lock.unlock() }
    var all: [Int] { lock.lock(); defer { lock.unlock() }; return sizes }
}

/// A fake compiled model: a folder holding model.json.
struct FakeSpec: Codable {
    /// noisy, flipped: the fixtures' parity variants of the golden embeddings (3 % noise; the first one negated).
    enum Kind: String, Codable { case golden, negated, nan, wrongDimension, unloadable, noMetadata, noisy, flipped }
    var kind: Kind
    var sha: String
    var delayMs = 0
    /// The model's `compression` metadata (`pipeline export --compress`); nil: none written.
    var compression: String? = nil
}

struct FakeEncoder: ImageEmbedder {
    let imageSize: Int
    let encoderSHA256: String
    let precision: Precision
    let spec: FakeSpec
    let answers: [[UInt8]: [Float]]
    let dimension: Int
    let log: BatchLog

    func embed(_ image: RGBImage) async throws -> [Float] {
        let gray = image.pixels.allSatisfy { $0 == 128 }
        guard let golden = answers[image.pixels] ?? (gray ? answers.values.first : nil) else {
            throw FixtureError("the encoder was given a crop that is not one of the pipeline's")
        }
        switch spec.kind {
        case .nan: return [Float](repeating: .nan, count: dimension)
        case .wrongDimension: return Array(golden.prefix(dimension - 1))
        case .negated: return golden.map { -$0 }
        default: return golden
        }
    }

    func embed(batch: [RGBImage]) async throws -> [[Float]] {
        log.add(batch.count)
        if spec.delayMs > 0 { try await Task.sleep(nanoseconds: UInt64(spec.delayMs) * 1_000_000) }
        var out: [[Float]] = []
        for image in batch { out.append(try await embed(image)) }
        return out
    }
}

struct FakeLoader: ModelLoader {
    let set: FixtureSet
    let log = BatchLog()

    func load(_ url: URL, preferring choice: ComputeChoice) async throws -> LoadedModel {
        let spec = try JSONDecoder().decode(FakeSpec.self, from: Data(contentsOf: url.appendingPathComponent("model.json")))
        if spec.kind == .unloadable { throw FixtureError("Failed to build the model execution plan (error code: -14)") }
        let m = set.manifest
        var meta = ["image_size": "\(m.imageSize)", "embedding_dim": "\(m.embeddingDim)", "encoder_sha256": spec.sha,
                    "method": "simclr", "backbone": "resnet18", "precision": "fp32"]
        if spec.kind == .noMetadata { meta["encoder_sha256"] = nil }
        if let c = spec.compression { meta["compression"] = c }
        let crops = m.queries.indices.map { set.expectedCrop($0).pixels }
        let rows = [FakeSpec.Kind.noisy, .flipped].contains(spec.kind) ? try set.parityVariant(spec.kind.rawValue) : set.queryEmbeddings
        let encoder = FakeEncoder(imageSize: m.imageSize, encoderSHA256: spec.sha,
                                  precision: Precision.of(ModelMetadata(meta), cpuOnly: choice == .cpuOnly), spec: spec,
                                  answers: Dictionary(zip(crops, rows), uniquingKeysWith: { a, _ in a }),
                                  dimension: m.embeddingDim, log: log)
        return LoadedModel(url: url, metadata: ModelMetadata(meta), inputNames: ["image"], outputNames: ["embedding"],
                           embedder: encoder, computeChoice: choice)
    }

    func plan(_ url: URL, for choice: ComputeChoice) async throws -> [OpPlacement]? {
        choice == .cpuOnly ? nil : [OpPlacement(op: "conv", preferred: .neuralEngine), OpPlacement(op: "reduce_l2_norm", preferred: .cpu)]
    }
}

final class EngineTests: XCTestCase {
    let set = FixtureTests.set
    var dir: URL!
    var loader: FakeLoader!

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("ekengine-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        loader = FakeLoader(set: set)
    }

    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    var goldenSHA: String { self.set.manifest.encoderSha256 }
    let otherSHA = String(repeating: "cd", count: 32)

    func engine(batchSize: Int = 4) throws -> DemoEngine {
        try DemoEngine(folder: dir.appendingPathComponent("app"), loader: loader, decoder: FixturePhotos(set: set), golden: set, batchSize: batchSize)
    }

    /// What the Apple layer does after compiling: the compiled folder moved into the models folder.
    func stage(_ engine: DemoEngine, _ spec: FakeSpec) throws -> URL {
        let compiled = dir.appendingPathComponent("compiled-\(UUID().uuidString).mlmodelc")
        try FileManager.default.createDirectory(at: compiled, withIntermediateDirectories: true)
        try JSONEncoder().encode(spec).write(to: compiled.appendingPathComponent("model.json"))
        return try ModelDirectory(folder: engine.stagingFolder).stage(compiled)
    }

    func installed(_ engine: DemoEngine) throws -> URL? { try ModelDirectory(folder: engine.stagingFolder).installed() }

    /// Stages `spec` and asks the engine to install it: the staged folder, and the error it was refused with.
    func refusal(_ engine: DemoEngine, _ spec: FakeSpec) async throws -> (URL, EngineError?) {
        let staged = try stage(engine, spec)
        do {
            _ = try await engine.install(staged: staged)
            return (staged, nil)
        } catch let e as EngineError {
            return (staged, e)
        }
    }

    func queryIndex(of vector: [Float], negated: Bool = false) -> Int? {
        set.queryEmbeddings.firstIndex { $0 == (negated ? vector.map { -$0 } : vector) }
    }

    func testANewModelReplacesTheInstalledOneOnlyAfterItLoadsAndPassesItsCheck() async throws {
        let engine = try engine()
        let good = try stage(engine, FakeSpec(kind: .golden, sha: goldenSHA))
        _ = try await engine.install(staged: good)
        XCTAssertEqual(try installed(engine), good)
        let cases: [(FakeSpec, (EngineError) -> Bool)] = [
            (FakeSpec(kind: .nan, sha: goldenSHA), { if case .failedCheck(let why) = $0 { return why[0].hasPrefix("golden crops: ") }; return false }),
            (FakeSpec(kind: .unloadable, sha: goldenSHA), { if case .doesNotLoad = $0 { return true }; return false }),
            (FakeSpec(kind: .wrongDimension, sha: otherSHA), { if case .failedCheck = $0 { return true }; return false }),
            (FakeSpec(kind: .nan, sha: otherSHA), { if case .failedCheck = $0 { return true }; return false }),
            (FakeSpec(kind: .noMetadata, sha: otherSHA), { if case .notAnEncoder = $0 { return true }; return false }),
        ]
        for (spec, expected) in cases {
            let (bad, error) = try await refusal(engine, spec)
            XCTAssertTrue(error.map(expected) ?? false, "\(spec.kind): \(String(describing: error))")
            XCTAssertEqual(try installed(engine), good, "\(spec.kind)")
            let current = await engine.model?.url
            XCTAssertEqual(current, good, "\(spec.kind)")
            XCTAssertFalse(FileManager.default.fileExists(atPath: bad.path), "\(spec.kind): the staged folder is removed")
        }
    }

    func testACompressedModelIsJudgedOnUseAndAnUncompressedOneOnItsRounding() async throws {
        let engine = try engine()
        // --compress int8 moves every golden embedding by a few percent: the compressed gates install it
        let int8 = try stage(engine, FakeSpec(kind: .noisy, sha: goldenSHA, compression: "int8"))
        _ = try await engine.install(staged: int8)
        XCTAssertEqual(try installed(engine), int8)
        // the same embeddings from an uncompressed model are a broken export; one image turned around fails any model
        let cases = [(FakeSpec(kind: .noisy, sha: goldenSHA), "golden crops: worst_rel_l2 "),
                     (FakeSpec(kind: .noisy, sha: goldenSHA, compression: "fp16"), "golden crops: worst_rel_l2 "),
                     (FakeSpec(kind: .flipped, sha: goldenSHA, compression: "palettize-6"), "golden crops: worst_cosine -")]
        for (spec, phrase) in cases {
            let (_, error) = try await refusal(engine, spec)
            guard case .failedCheck(let why)? = error else { return XCTFail("\(spec): \(String(describing: error))") }
            XCTAssertTrue(why[0].hasPrefix(phrase), "\(spec): \(why)")
            XCTAssertEqual(try installed(engine), int8, "\(spec)")
        }
        let lines = await engine.selfTest()
        XCTAssertEqual(lines.filter { $0.contains(", compressed gates): PASS") }.count, 3, "\(lines)")
    }

    func testTwoPickerBatchesAtOnceLoseNoRecordAndDoNotInterleave() async throws {
        let engine = try engine(batchSize: 4)
        _ = try await engine.install(staged: try stage(engine, FakeSpec(kind: .golden, sha: goldenSHA, delayMs: 5)))
        let first = (0..<10).map(FixturePhotos.photo), second = (10..<24).map(FixturePhotos.photo)
        async let a = engine.add(photos: first, label: "first")
        async let b = engine.add(photos: second + [Data("not a photo".utf8)], label: "second")
        let (ra, rb) = try await (a, b)
        XCTAssertEqual(ra.added, 10)
        XCTAssertEqual(ra.failed, [])
        XCTAssertEqual(rb.added, 14)
        XCTAssertEqual(rb.failed.count, 1)
        let indexNow = await engine.index
        let index = try XCTUnwrap(indexNow)
        XCTAssertEqual(index.records.count, 24)
        let labels = index.records.map(\.label)
        XCTAssertEqual(zip(labels, labels.dropFirst()).filter { $0 != $1 }.count, 1, "one batch after the other: \(labels)")
        let queries = index.records.map { queryIndex(of: $0.vector) }
        XCTAssertEqual(Set(queries.compactMap { $0 }), Set(0..<24), "every photo's embedding is the pipeline's")
        XCTAssertEqual(index.records.filter { $0.label == "first" }.map { queryIndex(of: $0.vector)! }, Array(0..<10))
        XCTAssertEqual(loader.log.all.sorted(), [2, 2, 4, 4, 4, 4, 4], "10 = 4+4+2; 14 and an unreadable one = 4+4+4+(3-1)")
        // The file holds what the engine holds, byte for byte as a whole save would write it.
        XCTAssertEqual(try Data(contentsOf: engine.indexURL), index.serialized())
        let stored = try FileManager.default.contentsOfDirectory(atPath: engine.photosFolder.path)
        XCTAssertEqual(stored.count, 48, "24 photos and their thumbnails")
        XCTAssertEqual(try Data(contentsOf: engine.thumbnailURL(index.records[0].id)), Data("thumbnail \(queries[0]!)".utf8))
    }

    func testANewEncoderReEmbedsEveryStoredPhotoKeepingIdsAndLabels() async throws {
        let engine = try engine(batchSize: 3)
        _ = try await engine.install(staged: try stage(engine, FakeSpec(kind: .golden, sha: goldenSHA)))
        _ = try await engine.add(photos: (0..<6).map(FixturePhotos.photo), label: "x")
        _ = try await engine.add(photos: (6..<10).map(FixturePhotos.photo), label: "y")
        let beforeNow = await engine.index
        let before = try XCTUnwrap(beforeNow)
        let seen = BatchLog()
        let notes = try await engine.install(staged: try stage(engine, FakeSpec(kind: .negated, sha: otherSHA))) { done, total in seen.add(done * 100 + total) }
        XCTAssertTrue(notes.contains("re-embedded 10 of 10 photos with the new model"), "\(notes)")
        XCTAssertEqual(seen.all.last, 1010)
        let afterNow = await engine.index
        let after = try XCTUnwrap(afterNow)
        XCTAssertEqual(after.encoderSHA256, otherSHA)
        XCTAssertEqual(after.records.map(\.id), before.records.map(\.id))
        XCTAssertEqual(after.records.map(\.label), before.records.map(\.label))
        XCTAssertEqual(after.records.map { queryIndex(of: $0.vector, negated: true) }, before.records.map { queryIndex(of: $0.vector) })
        XCTAssertEqual(try EmbeddingIndex.load(from: engine.indexURL, expectedEncoder: otherSHA).records, after.records)
    }

    func testALaunchReopensTheIndexAndFinishesAnInterruptedSwap() async throws {
        let first = try engine()
        let good = try stage(first, FakeSpec(kind: .golden, sha: goldenSHA))
        _ = try await first.install(staged: good)
        _ = try await first.add(photos: (0..<5).map(FixturePhotos.photo), label: "kept")
        let again = try engine()
        let notes = await again.start()
        XCTAssertEqual(notes, [])
        let reopened = await again.index?.records
        let original = await first.index?.records
        XCTAssertEqual(reopened, original)
        // The app killed right after a swap, before its re-embed: the next launch re-embeds, and removes the old model.
        let other = try stage(again, FakeSpec(kind: .negated, sha: otherSHA))
        try ModelDirectory(folder: again.stagingFolder).install(other)
        let third = try engine()
        let relaunch = await third.start()
        XCTAssertEqual(relaunch, ["re-embedded 5 of 5 photos with the new model"])
        let sha = await third.index?.encoderSHA256
        XCTAssertEqual(sha, otherSHA)
        XCTAssertFalse(FileManager.default.fileExists(atPath: good.path))
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: third.stagingFolder.path).sorted(), [other.lastPathComponent, "current"].sorted())
    }

    func testAPointerThatCannotBeReadRemovesNoModel() throws {
        let models = try ModelDirectory(folder: dir.appendingPathComponent("Models"))
        let compiled = dir.appendingPathComponent("m.mlmodelc")
        try FileManager.default.createDirectory(at: compiled, withIntermediateDirectories: true)
        let staged = try models.stage(compiled)
        XCTAssertNil(try models.installed())
        try models.install(staged)
        XCTAssertEqual(try models.installed(), staged)
        XCTAssertThrowsError(try models.install(compiled)) { XCTAssertEqual($0 as? ModelDirectoryError, .notStaged(compiled.path)) }
        try Data("../elsewhere".utf8).write(to: models.folder.appendingPathComponent("current"))
        XCTAssertThrowsError(try models.removeStale())
        XCTAssertTrue(FileManager.default.fileExists(atPath: staged.path))
        models.discard(staged)
        XCTAssertTrue(FileManager.default.fileExists(atPath: staged.path), "unsure what is installed: nothing is removed")
    }

    func testCameraFramesAndPhotosReachTheModelThroughTheSameCrop() async throws {
        let engine = try engine()
        _ = try await engine.install(staged: try stage(engine, FakeSpec(kind: .golden, sha: goldenSHA)))
        for (i, q) in set.manifest.queries.enumerated() {
            _ = try await engine.add(photos: [FixturePhotos.photo(i)], label: set.manifest.classes[q.label])
        }
        let indexNow = await engine.index
        let index = try XCTUnwrap(indexNow)
        for i in set.manifest.queries.indices {
            let (buffer, orientation) = try set.buffer(i)
            // What the camera hands over: 32BGRA with padded rows (CVPixelBuffer's bytesPerRow).
            let frame = framePixels(Pixels.rgb(from: buffer), layout: .bgra, padding: 24)
            let answer = try await engine.classify(frame: frame, orientation: orientation, top: 3, threshold: 0.5)
            XCTAssertEqual(answer.neighbours[0].id, index.records[i].id, "query \(i): the frame finds its own stored photo")
            XCTAssertEqual(answer.neighbours[0].similarity, 1, accuracy: 1e-6)
            let classes = Array(Set(index.records.map(\.label))).sorted()
            let vote = Classifiers.knn(set.queryEmbeddings[i], bank: index.records.map(\.vector),
                                       labels: index.records.map { classes.firstIndex(of: $0.label)! }, classes: classes.count)
            XCTAssertEqual(answer.knnLabel, classes[vote.label])
            let viaPhoto = try await engine.search(photo: FixturePhotos.photo(i), top: 3, threshold: 0.5)
            XCTAssertEqual(viaPhoto.neighbours, answer.neighbours)
        }
    }

    func testTheSelfTestRunsEachUnitAndSaysWhereThePlanIsUnknown() async throws {
        let engine = try engine()
        let none = await engine.selfTest()
        XCTAssertEqual(none, ["import a model first"])
        do {
            _ = try await engine.add(photos: [FixturePhotos.photo(0)], label: "x")
            XCTFail("added without a model")
        } catch let e as EngineError { XCTAssertEqual(e, .noModel) }
        _ = try await engine.install(staged: try stage(engine, FakeSpec(kind: .golden, sha: goldenSHA)))
        let lines = await engine.selfTest()
        XCTAssertEqual(lines.filter { $0.contains(": PASS") }.count, 3, "\(lines)")
        XCTAssertEqual(lines[1], "  " + ComputePlanSummary.unavailable)
        XCTAssertTrue(lines.contains("  operations planned: 2 — Neural Engine 1 (50 %), GPU 0 (0 %), CPU 1 (50 %)"), "\(lines)")
    }
}

/// RGB pixels laid out as a camera or CoreGraphics buffer: 4 bytes a pixel, opaque, rows padded with junk.
func framePixels(_ rgb: RGBImage, layout: PixelLayout, padding: Int) -> PixelBuffer {
    let row = rgb.width * 4 + padding
    var bytes = [UInt8](repeating: 0xA5, count: row * rgb.height)
    let (r, g, b, a) = layout == .bgra ? (2, 1, 0, 3) : (0, 1, 2, 3)
    for y in 0..<rgb.height {
        for x in 0..<rgb.width {
            let s = (y * rgb.width + x) * 3, d = y * row + x * 4
            bytes[d + r] = rgb.pixels[s]
            bytes[d + g] = rgb.pixels[s + 1]
            bytes[d + b] = rgb.pixels[s + 2]
            bytes[d + a] = 255
        }
    }
    return try! PixelBuffer(width: rgb.width, height: rgb.height, layout: layout, bytes: bytes, bytesPerRow: row)
}
