// `pipeline validate`'s metrics and gates (export/parity.py, export/configs.py's ValidateConfig defaults), for the
// app's self-test: the model on this device against the pipeline's fp32 embeddings of the same golden crops.
//
// Cosine alone is too loose (an RGB/BGR swap still scores ~0.999), so fp32 needs max abs <= 1e-4 and cosine >= 0.99999,
// fp16 (the Neural Engine, the GPU) needs every image's relative L2 <= 1e-2 and top-10 neighbour agreement >= 0.95.
// A compressed model (`pipeline export --compress`: 8-bit, palettized or pruned weights) moves every embedding by
// several percent, by design; it is held to what an app does with an embedding: top-10 agreement >= 0.80 and no
// image below cosine 0.90. Its kNN and probe drops need labelled train images; validate measured those before the
// model shipped.

import Foundation

/// validate's default bounds; `FixtureTests` holds them to the `gates` the pipeline writes into the golden files.
public struct ParityGates: Codable, Equatable, Sendable {
    public var fp32MaxAbs = 1e-4
    public var fp32MinCosine = 0.99999
    public var fp16MaxRelL2 = 1e-2
    public var fp16MinTopK = 0.95
    public var compressedMinTopK = 0.80
    public var compressedMinCosine = 0.90
    public var topK = 10

    public init() {}
}

public enum Precision: String, Codable, Sendable, CaseIterable {
    case fp32, fp16, compressed

    /// The gates a loaded model is held to: a compressed model's wherever it runs; fp32 only for an fp32 model on
    /// the CPU alone (the GPU and Neural Engine compute in fp16); fp16 otherwise.
    public static func of(_ metadata: ModelMetadata, cpuOnly: Bool) -> Precision {
        if metadata.compression != ModelMetadata.uncompressed { return .compressed }
        return metadata["precision"] == "fp32" && cpuOnly ? .fp32 : .fp16
    }
}

public struct ParityMetrics: Equatable, Sendable {
    public let images: Int
    public let worstCosine: Double
    public let meanCosine: Double
    public let worstRelL2: Double
    public let meanRelL2: Double
    public let maxAbs: Double
    public let topK: Int
    public let topKAgreement: Double?
    public let worstImage: Int
}

public enum Parity {
    /// Metrics of `output` against `reference` (N rows each, same dimension).
    public static func compare(reference: [[Float]], output: [[Float]], topK: Int = 10) -> ParityMetrics? {
        guard reference.count == output.count, !reference.isEmpty,
              zip(reference, output).allSatisfy({ $0.count == $1.count }) else { return nil }
        var cos: [Double] = [], rel: [Double] = [], maxAbs = 0.0
        for (r, a) in zip(reference, output) {
            let nr = Vectors.norm(r), na = Vectors.norm(a)
            var d2 = 0.0
            for i in 0..<r.count {
                let d = Double(a[i]) - Double(r[i])
                d2 += d * d
                maxAbs = max(maxAbs, abs(d))
            }
            let diff = d2.squareRoot()
            cos.append(nr > 0 && na > 0 ? Vectors.dot(r, a) / (nr * na) : (nr == 0 && na == 0 ? 1 : 0))
            rel.append(nr > 0 ? diff / nr : (diff == 0 ? 0 : .infinity))
        }
        let worst = rel.indices.max { rel[$0] < rel[$1] } ?? 0
        let k = min(topK, reference.count - 1)
        return ParityMetrics(images: reference.count, worstCosine: cos.min()!, meanCosine: cos.reduce(0, +) / Double(cos.count),
                             worstRelL2: rel.max()!, meanRelL2: rel.reduce(0, +) / Double(rel.count), maxAbs: maxAbs,
                             topK: max(k, 0), topKAgreement: k >= 1 ? agreement(reference, output, k: k) : nil,
                             worstImage: worst)
    }

    /// Each row's k most cosine-similar other rows; ties broken by index.
    static func neighbours(_ rows: [[Float]], k: Int) -> [[Int]] {
        let unit = rows.map(Vectors.normalized)
        return unit.indices.map { i in
            let sims = unit.indices.map { j in j == i ? -Double.infinity : Vectors.dot(unit[i], unit[j]) }
            return Array(sims.indices.sorted { sims[$0] > sims[$1] || (sims[$0] == sims[$1] && $0 < $1) }.prefix(k))
        }
    }

    static func agreement(_ a: [[Float]], _ b: [[Float]], k: Int) -> Double {
        let na = neighbours(a, k: k), nb = neighbours(b, k: k)
        let overlaps = zip(na, nb).map { Double(Set($0).intersection($1).count) / Double(k) }
        return overlaps.reduce(0, +) / Double(overlaps.count)
    }

    /// Empty when the artifact passes; else one phrase per failed gate, worded as validate words it.
    public static func failures(_ m: ParityMetrics, precision: Precision, gates: ParityGates = ParityGates()) -> [String] {
        var fails: [String] = []
        switch precision {
        case .fp32:
            if !(m.maxAbs <= gates.fp32MaxAbs) { fails.append("max_abs \(m.maxAbs) > \(gates.fp32MaxAbs)") }
            if !(m.worstCosine >= gates.fp32MinCosine) { fails.append("worst_cosine \(m.worstCosine) < \(gates.fp32MinCosine)") }
        case .fp16:
            if !(m.worstRelL2 <= gates.fp16MaxRelL2) { fails.append("worst_rel_l2 \(m.worstRelL2) > \(gates.fp16MaxRelL2)") }
            fails += topK(m, atLeast: gates.fp16MinTopK)
        case .compressed:
            fails += topK(m, atLeast: gates.compressedMinTopK)
            if !(m.worstCosine >= gates.compressedMinCosine) { fails.append("worst_cosine \(m.worstCosine) < \(gates.compressedMinCosine)") }
        }
        return fails
    }

    static func topK(_ m: ParityMetrics, atLeast bound: Double) -> [String] {
        guard let agree = m.topKAgreement else { return ["top-k agreement needs at least 2 images"] }
        return agree >= bound ? [] : ["top\(m.topK)_agreement \(agree) < \(bound)"]
    }
}
