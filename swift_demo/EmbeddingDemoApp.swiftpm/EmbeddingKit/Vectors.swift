// Embedding arithmetic. Sums run in Double: a 2048-d dot product in Float loses ~1e-5, which is the tolerance the
// fixtures pin the pipeline's kNN scores to.

import Foundation

public enum Vectors {
    public static func dot(_ a: [Float], _ b: [Float]) -> Double {
        precondition(a.count == b.count, "dot of \(a.count)-d and \(b.count)-d vectors")
        var s = 0.0
        for i in 0..<a.count { s += Double(a[i]) * Double(b[i]) }
        return s
    }

    public static func norm(_ a: [Float]) -> Double { dot(a, a).squareRoot() }

    /// a / ||a||; a zero vector stays zero (its cosine with anything is 0), as F.normalize's eps makes it.
    public static func normalized(_ a: [Float]) -> [Float] {
        let n = norm(a)
        return n > 0 ? a.map { Float(Double($0) / n) } : a
    }

    public static func cosine(_ a: [Float], _ b: [Float]) -> Double {
        let na = norm(a), nb = norm(b)
        return na > 0 && nb > 0 ? dot(a, b) / (na * nb) : 0
    }

    /// Little-endian float32 rows (the fixtures' and the index's on-disk form).
    public static func floats(fromLittleEndian data: Data) -> [Float] {
        precondition(data.count % 4 == 0, "float32 data must be a multiple of 4 bytes")
        var out = [Float](repeating: 0, count: data.count / 4)
        data.withUnsafeBytes { raw in
            for i in 0..<out.count {
                out[i] = Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: i * 4, as: UInt32.self)))
            }
        }
        return out
    }

    public static func rows(_ flat: [Float], dimension: Int) -> [[Float]] {
        precondition(dimension > 0 && flat.count % dimension == 0, "\(flat.count) floats are not rows of \(dimension)")
        return stride(from: 0, to: flat.count, by: dimension).map { Array(flat[$0..<($0 + dimension)]) }
    }
}
