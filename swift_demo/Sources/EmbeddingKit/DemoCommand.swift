// `embedding-demo`: the core's face on the command line (Linux and macOS). It works on a folder written by
// `pipeline swift-fixtures` (raw pixel buffers, their embeddings, the pipeline's answers): no model runs here, the
// embeddings come with the folder.
//
//   embedding-demo check FOLDER                 crops and every prediction against the pipeline's; exit 1 on a difference
//   embedding-demo index FOLDER OUT.ekix        the bank rows as an index file
//   embedding-demo search INDEX FOLDER QUERY [--top N]   a query's nearest stored embeddings
//   embedding-demo classify INDEX FOLDER        every query: weighted kNN, majority, nearest centroid
//   embedding-demo bench [RECORDS] [DIM] [PHOTO_WIDTH]   the app's index and crop costs on synthetic data

import Foundation

public enum DemoCommand {
    public static let usage = """
        usage: embedding-demo check FOLDER
               embedding-demo index FOLDER OUT.ekix
               embedding-demo search INDEX FOLDER QUERY [--top N]
               embedding-demo classify INDEX FOLDER
               embedding-demo bench [RECORDS] [DIM] [PHOTO_WIDTH]   (default 5000 512 4032)
        FOLDER is written by `pipeline swift-fixtures` (swift_demo/Tests/EmbeddingKitTests/Fixtures).
        """

    /// Runs one command; returns the exit status (0 ok, 1 a check failed, 2 bad input). Output goes through `say`.
    public static func run(_ args: [String], say: (String) -> Void) -> Int32 {
        do {
            switch args.first {
            case "check" where args.count == 2:
                return try check(FixtureSet(folder: url(args[1])), say: say) ? 0 : 1
            case "index" where args.count == 3:
                let set = try FixtureSet(folder: url(args[1]))
                let index = try set.bankIndex()
                try index.save(to: url(args[2]))
                say("wrote \(args[2]): \(index.records.count) embeddings, \(index.dimension)-d, encoder \(index.encoderSHA256.prefix(12))")
                return 0
            case "search" where args.count == 4 || (args.count == 6 && args[4] == "--top"):
                let set = try FixtureSet(folder: url(args[2]))
                let index = try EmbeddingIndex.load(from: url(args[1]), expectedEncoder: set.manifest.encoderSha256)
                guard let q = Int(args[3]), set.queryEmbeddings.indices.contains(q) else {
                    throw FixtureError("QUERY must be 0..<\(set.queryEmbeddings.count), got \(args[3])")
                }
                guard let top = args.count == 6 ? Int(args[5]) : 5, top > 0 else { throw FixtureError("--top must be a positive integer") }
                say("query \(q) (\(set.manifest.queries[q].source), label \(set.manifest.classes[set.manifest.queries[q].label])):")
                for (rank, hit) in try index.search(set.queryEmbeddings[q], top: top).enumerated() {
                    say(String(format: "%2d  %@  label %@  cosine %.6f", rank + 1, hit.record.id, hit.record.label, hit.similarity))
                }
                return 0
            case "classify" where args.count == 3:
                let set = try FixtureSet(folder: url(args[2]))
                let index = try EmbeddingIndex.load(from: url(args[1]), expectedEncoder: set.manifest.encoderSha256)
                classify(index: index, set: set, say: say)
                return 0
            case "bench" where args.count <= 4:
                let given = args.dropFirst().map { Int($0) ?? 0 }
                guard given.allSatisfy({ $0 > 0 }) else { throw FixtureError("RECORDS, DIM and PHOTO_WIDTH must be positive integers") }
                let n = given + [5000, 512, 4032].dropFirst(given.count)
                try Bench.run(records: n[0], dimension: n[1], photoWidth: n[2], say: say)
                return 0
            default:
                say(usage)
                return 2
            }
        } catch {
            say("error: \(error)")
            return 2
        }
    }

    static func url(_ path: String) -> URL { URL(fileURLWithPath: path) }

    /// Labels come from the index (class names), so this is what an app holding only the index would answer.
    static func classify(index: EmbeddingIndex, set: FixtureSet, say: (String) -> Void) {
        let classes = set.manifest.classes
        let bank = index.records.map(\.vector)
        let labels = index.records.map { classes.firstIndex(of: $0.label) ?? -1 }
        let centroid = NearestCentroid(bank: bank, labels: labels, classes: classes.count,
                                       threshold: set.manifest.expected.centroidThreshold)
        say("query  truth  kNN(k=\(Classifiers.weightedK))  majority(k=\(Classifiers.majorityK))  centroid (cosine)")
        for (i, q) in set.queryEmbeddings.enumerated() {
            let knn = Classifiers.knn(q, bank: bank, labels: labels, classes: classes.count)
            let maj = Classifiers.majority(q, bank: bank, labels: labels, classes: classes.count)
            let c = centroid.predict(q)
            let cen = c.map { "\($0.label.map { classes[$0] } ?? "unknown") (\(String(format: "%.4f", $0.cosine)))" } ?? "-"
            say("\(i)  \(classes[set.manifest.queries[i].label])  \(classes[knn.label])  \(classes[maj.label])  \(cen)")
        }
    }

    /// Everything the fixtures pin, one line per difference; true when there is none.
    public static func check(_ set: FixtureSet, say: (String) -> Void) throws -> Bool {
        let m = set.manifest, e = m.expected
        var diffs: [String] = []
        for i in m.queries.indices {
            let (buffer, orientation) = try set.buffer(i)
            let crop = Pixels.pipelineCrop(buffer, orientation: orientation, size: m.imageSize)
            let want = set.expectedCrop(i)
            if crop != want {
                let differing = zip(crop.pixels, want.pixels).filter { $0 != $1 }.count
                diffs.append("query \(i) (\(m.queries[i].width)x\(m.queries[i].height) \(m.queries[i].layout.rawValue) orientation \(orientation.rawValue)): crop differs in \(differing) bytes")
            }
        }
        let bank = set.bankEmbeddings, labels = set.bankLabels, classes = m.classes.count
        let centroid = NearestCentroid(bank: bank, labels: labels, classes: classes, threshold: e.centroidThreshold)
        for (i, q) in set.queryEmbeddings.enumerated() {
            let want = e.queries[i]
            let knn = Classifiers.knn(q, bank: bank, labels: labels, classes: classes, k: e.weightedK, temperature: e.temperature)
            if knn.label != want.knnLabel { diffs.append("query \(i): kNN label \(knn.label), the pipeline's \(want.knnLabel)") }
            for (c, (got, exp)) in zip(knn.scores, want.knnScores).enumerated() where !close(got, exp, rtol: 1e-5) {
                diffs.append("query \(i): kNN score of class \(c) \(got), the pipeline's \(exp)")
            }
            let maj = Classifiers.majority(q, bank: bank, labels: labels, classes: classes, k: e.majorityK)
            if maj.label != want.majorityLabel || maj.scores.map({ Int($0) }) != want.majorityVotes {
                diffs.append("query \(i): majority \(maj.label) \(maj.scores), the pipeline's \(want.majorityLabel) \(want.majorityVotes)")
            }
            if let c = centroid.predict(q) {
                if c.label != want.centroidLabel || c.nearest != want.centroidNearest || !close(c.cosine, want.centroidCosine, rtol: 1e-5) {
                    diffs.append("query \(i): centroid \(String(describing: c.label)) (\(c.cosine)), the pipeline's \(String(describing: want.centroidLabel)) (\(want.centroidCosine))")
                }
            } else {
                diffs.append("query \(i): no centroid prediction")
            }
            let top = Classifiers.nearest(q, in: bank, k: want.topIds.count)
            if top.map(\.index) != want.topIds || zip(top, want.topSimilarities).contains(where: { !close($0.similarity, $1, rtol: 1e-5) }) {
                diffs.append("query \(i): top ids \(top.map(\.index)), the pipeline's \(want.topIds)")
            }
        }
        for (name, want) in m.parity.variants.sorted(by: { $0.key < $1.key }) {
            guard let got = Parity.compare(reference: set.queryEmbeddings, output: try set.parityVariant(name), topK: m.parity.topK) else {
                diffs.append("parity \(name): shapes differ"); continue
            }
            let pairs: [(String, Double, Double)] = [("worst_cosine", got.worstCosine, want.worstCosine), ("mean_cosine", got.meanCosine, want.meanCosine),
                                                     ("worst_rel_l2", got.worstRelL2, want.worstRelL2), ("mean_rel_l2", got.meanRelL2, want.meanRelL2),
                                                     ("max_abs", got.maxAbs, want.maxAbs), ("topk_agreement", got.topKAgreement ?? -1, want.topkAgreement ?? -1)]
            for (metric, g, w) in pairs where !close(g, w, rtol: 1e-6, atol: 1e-9) { diffs.append("parity \(name): \(metric) \(g), the pipeline's \(w)") }
            if Precision.allCases.contains(where: { Parity.failures(got, precision: $0).isEmpty == want.fails($0) }) {
                diffs.append("parity \(name): gate verdicts differ from the pipeline's")
            }
        }
        for d in diffs { say(d) }
        say(diffs.isEmpty ? "ok: \(m.queries.count) crops byte-identical, kNN / majority / centroid / top-\(e.queries.first?.topIds.count ?? 0) / parity as the pipeline computed them"
                          : "\(diffs.count) differences from the pipeline")
        return diffs.isEmpty
    }

    static func close(_ a: Double, _ b: Double, rtol: Double, atol: Double = 0) -> Bool {
        abs(a - b) <= atol + rtol * abs(b)
    }
}
