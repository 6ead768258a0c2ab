// `embedding-demo bench [RECORDS] [DIM] [PHOTO_WIDTH]`: the costs docs/ipad-demo.md quotes, on synthetic data, so they can be
// measured again on any machine (`swift run -c release embedding-demo bench`): saving the index whole against
// appending to it, opening it, classifying one query with and without the prepared bank, and a 12 MP photo's crop.
// Each line gives wall time and process CPU time (on a loaded machine only the second means much).

import Foundation

enum Bench {
    static func run(records n: Int, dimension dim: Int, photoWidth w: Int, say: (String) -> Void) throws {
        var generator = SplitMix(seed: 1)
        func record(_ i: Int) -> IndexRecord {
            IndexRecord(id: "photo-\(i)", label: "class\(i % 10)", vector: (0..<dim).map { _ in generator.float() })
        }
        var index = EmbeddingIndex(dimension: dim, encoderSHA256: String(repeating: "ab", count: 32))
        for i in 0..<n { try index.add(record(i)) }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ekbench-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }  // a temporary folder
        let url = dir.appendingPathComponent("bench.ekix")

        try time("save \(n) records whole", say) { try index.save(to: url) }
        var file: IndexFile?
        try time("open \(n) records", say) { file = try IndexFile(url: url, dimension: dim, encoderSHA256: index.encoderSHA256) }
        var next = n
        try time("append 1 record, synced", say) { try file!.append([record(next)]); next += 1 }
        let batch = (0..<16).map { record(next + $0) }
        try time("append a batch of 16, synced", say) { try file!.append(batch) }
        let stored = file!.index, query = record(0).vector
        try time("classify 1 query, bank normalised per query", say) {
            let bank = LabelledBank(stored)
            let rows = stored.records.map(\.vector)
            _ = Classifiers.knn(query, bank: rows, labels: bank.labels, classes: bank.classes.count)
            _ = NearestCentroid(bank: rows, labels: bank.labels, classes: bank.classes.count, threshold: 0.5).predict(query)
            _ = try stored.search(query, top: 5)
        }
        var prepared: LabelledBank?
        try time("prepare the bank once", say) { prepared = LabelledBank(stored) }
        try time("classify 1 query, bank prepared", say) { _ = prepared!.answer(query, top: 5, threshold: 0.5) }
        let h = w * 3 / 4
        let photo = try PixelBuffer(width: w, height: h, layout: .bgra, bytes: (0..<(w * h * 4)).map { UInt8(truncatingIfNeeded: $0 &* 40503 >> 7) })
        try time("crop a \(w)x\(h) BGRA photo to 224 (EXIF 6)", say) { _ = Pixels.pipelineCrop(photo, orientation: .right, size: 224) }
    }

    static func time(_ what: String, _ say: (String) -> Void, _ body: () throws -> Void) throws {
        let wall0 = Date(), cpu0 = clock()
        try body()
        let cpu = Double(clock() - cpu0) / Double(CLOCKS_PER_SEC) * 1e3, wall = Date().timeIntervalSince(wall0) * 1e3
        say(what.padding(toLength: 48, withPad: " ", startingAt: 0) + String(format: " %9.1f ms wall %9.1f ms CPU", wall, cpu))
    }
}

/// A small seeded generator, so every run measures the same bytes.
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func float() -> Float { Float(next() >> 40) / Float(1 << 24) * 2 - 1 }
}
