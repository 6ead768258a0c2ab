// Classifiers over stored embeddings, exactly as the pipeline evaluates the encoder (train/knn.py), so the label an
// app shows is the one `pipeline linear-eval` measured:
// - weighted kNN (Wu et al. 2018): the k = 200 most cosine-similar bank rows (k capped at the bank size), each
//   voting exp(sim / 0.1) for its class;
// - majority kNN: k = 20, one vote each;
// - nearest centroid for few-shot labels (a handful of photos per class), with an "unknown" below a cosine threshold.
// Ties go to the lowest class index (torch's argmax, scikit-learn's vote).

import Foundation

public struct Neighbour: Equatable, Sendable {
    public let index: Int
    public let similarity: Double
}

public struct Vote: Equatable, Sendable {
    public let label: Int
    public let scores: [Double]
}

public enum Classifiers {
    public static let weightedK = 200
    public static let temperature = 0.1
    public static let majorityK = 20

    /// The k rows most cosine-similar to `query`, most similar first; equal similarities in row order.
    public static func nearest(_ query: [Float], in bank: [[Float]], k: Int) -> [Neighbour] {
        nearest(query, inNormalized: bank.map(Vectors.normalized), k: k)
    }

    /// The same, for rows already normalised (Vectors.normalized): a bank prepared once for many queries.
    public static func nearest(_ query: [Float], inNormalized unit: [[Float]], k: Int) -> [Neighbour] {
        let q = Vectors.normalized(query)
        let sims = unit.map { Vectors.dot(q, $0) }
        let order = sims.indices.sorted { sims[$0] > sims[$1] || (sims[$0] == sims[$1] && $0 < $1) }
        return order.prefix(max(0, min(k, unit.count))).map { Neighbour(index: $0, similarity: sims[$0]) }
    }

    /// First index of the largest score: the lowest class wins a tie.
    static func argmax(_ scores: [Double]) -> Int {
        var best = 0
        for i in scores.indices where scores[i] > scores[best] { best = i }
        return best
    }

    /// train/knn.py knn_scores: temperature nil = one vote per neighbour, else exp(sim / T).
    public static func knn(_ query: [Float], bank: [[Float]], labels: [Int], classes: Int,
                           k: Int = weightedK, temperature: Double? = temperature) -> Vote {
        precondition(bank.count == labels.count, "one label per bank row")
        return vote(nearest(query, in: bank, k: k), labels: labels, classes: classes, temperature: temperature)
    }

    /// The votes of `neighbours` (most similar first, as `nearest` gives them).
    public static func vote(_ neighbours: [Neighbour], labels: [Int], classes: Int, temperature: Double? = temperature) -> Vote {
        var scores = [Double](repeating: 0, count: classes)
        for n in neighbours { scores[labels[n.index]] += temperature.map { exp(n.similarity / $0) } ?? 1 }
        return Vote(label: argmax(scores), scores: scores)
    }

    public static func majority(_ query: [Float], bank: [[Float]], labels: [Int], classes: Int, k: Int = majorityK) -> Vote {
        knn(query, bank: bank, labels: labels, classes: classes, k: k, temperature: nil)
    }
}

/// Few-shot classification: each class is the normalised mean of its normalised embeddings.
public struct NearestCentroid: Sendable {
    public struct Prediction: Equatable, Sendable {
        public let nearest: Int
        public let cosine: Double
        /// nil when the best cosine is below the threshold: "unknown", not a guess.
        public let label: Int?
    }

    public let centroids: [[Float]?]  // nil for a class without examples
    public var threshold: Double

    public init(bank: [[Float]], labels: [Int], classes: Int, threshold: Double) {
        var sums = [[Double]?](repeating: nil, count: classes)
        var counts = [Int](repeating: 0, count: classes)
        for (row, label) in zip(bank, labels) {
            let u = Vectors.normalized(row)
            var s = sums[label] ?? [Double](repeating: 0, count: u.count)
            for i in u.indices { s[i] += Double(u[i]) }
            sums[label] = s
            counts[label] += 1
        }
        centroids = sums.enumerated().map { c, s in s.map { Vectors.normalized($0.map { Float($0 / Double(counts[c])) }) } }
        self.threshold = threshold
    }

    public func predict(_ query: [Float]) -> Prediction? {
        let q = Vectors.normalized(query)
        var best: (Int, Double)?
        for (c, centroid) in centroids.enumerated() {
            guard let centroid else { continue }
            let s = Vectors.dot(q, centroid)
            if best == nil || s > best!.1 { best = (c, s) }
        }
        guard let (c, s) = best else { return nil }
        return Prediction(nearest: c, cosine: s, label: s >= threshold ? c : nil)
    }
}

/// Stored embeddings prepared once for many queries (every camera frame): rows normalised, classes numbered
/// (sorted names), centroids made. Its answers are those of Classifiers and NearestCentroid on the same rows.
public struct LabelledBank: Sendable {
    public let classes: [String]
    public let ids: [String]
    public let labels: [Int]
    let unit: [[Float]]
    let centroids: NearestCentroid

    public init(_ index: EmbeddingIndex) {
        classes = Array(Set(index.records.map(\.label))).sorted()
        let position = Dictionary(uniqueKeysWithValues: classes.enumerated().map { ($1, $0) })
        ids = index.records.map(\.id)
        labels = index.records.map { position[$0.label]! }
        unit = index.records.map { Vectors.normalized($0.vector) }
        centroids = NearestCentroid(bank: index.records.map(\.vector), labels: labels, classes: classes.count, threshold: 0)
    }

    public var isEmpty: Bool { unit.isEmpty }

    /// Weighted kNN, the nearest centroid at `threshold`, and the `top` nearest rows: one scan of the bank.
    public func answer(_ query: [Float], top: Int, threshold: Double) -> (knn: Vote, centroid: NearestCentroid.Prediction?, nearest: [Neighbour]) {
        let neighbours = Classifiers.nearest(query, inNormalized: unit, k: max(Classifiers.weightedK, top))
        var c = centroids
        c.threshold = threshold
        return (Classifiers.vote(Array(neighbours.prefix(Classifiers.weightedK)), labels: labels, classes: classes.count),
                c.predict(query), Array(neighbours.prefix(top)))
    }
}
