// The app's store of labelled embeddings and its brute-force search (a few thousand photos: a linear scan of
// 512-d dot products takes well under a frame).
//
// File format, version 1, little-endian:
//   "EKIX"  magic (4 bytes)
//   UInt32  version
//   UInt32  dimension
//   32 B    sha256 of the encoder.pt the embeddings were made with (the model's `encoder_sha256`)
//   UInt32  record count
//   records: UInt16 id length, id (UTF-8), UInt16 label length, label (UTF-8), dimension x Float32
//   UInt32  CRC-32 of every byte before it
// Written atomically (temp file + rename): a crash mid-save leaves the previous file. A file that is truncated,
// corrupt, of another version or from another model is refused with an error saying which, and is left as it is:
// nothing already stored is lost by trying to open it.

import Foundation

public struct IndexRecord: Equatable, Sendable {
    public let id: String
    public let label: String
    public let vector: [Float]

    public init(id: String, label: String, vector: [Float]) {
        self.id = id
        self.label = label
        self.vector = vector
    }
}

public enum IndexError: Error, CustomStringConvertible, Equatable {
    case notAnIndex(String)
    case unsupportedVersion(UInt32)
    case truncated(String)
    case corrupt(String)
    case otherModel(file: String, expected: String)
    case dimensionMismatch(expected: Int, got: Int)
    case duplicateID(String)
    case tooLong(String)

    public var description: String {
        switch self {
        case .notAnIndex(let why): return "not an embedding index: \(why)"
        case .unsupportedVersion(let v): return "index file version \(v) is not supported (this app reads version \(EmbeddingIndex.version))"
        case .truncated(let why): return "index file is truncated: \(why)"
        case .corrupt(let why): return "index file is corrupt: \(why)"
        case .otherModel(let file, let expected):
            return "index was made with encoder \(file.prefix(12)), the model is \(expected.prefix(12)): re-embed the photos"
        case .dimensionMismatch(let expected, let got): return "embedding has \(got) values, the index holds \(expected)-d vectors"
        case .duplicateID(let id): return "an embedding with id \(id) is already stored"
        case .tooLong(let what): return "\(what) is longer than 65,535 bytes"
        }
    }
}

public struct EmbeddingIndex: Sendable {
    public static let magic: [UInt8] = Array("EKIX".utf8)
    public static let version: UInt32 = 1

    public let dimension: Int
    public let encoderSHA256: String  // 64 hex digits
    public private(set) var records: [IndexRecord] = []

    public init(dimension: Int, encoderSHA256: String) {
        precondition(dimension > 0, "dimension must be positive")
        precondition(Self.shaBytes(encoderSHA256) != nil, "encoder sha256 must be 64 hex digits")
        self.dimension = dimension
        self.encoderSHA256 = encoderSHA256.lowercased()
    }

    public mutating func add(_ record: IndexRecord) throws {
        guard record.vector.count == dimension else { throw IndexError.dimensionMismatch(expected: dimension, got: record.vector.count) }
        guard !records.contains(where: { $0.id == record.id }) else { throw IndexError.duplicateID(record.id) }
        guard record.id.utf8.count <= 65_535 else { throw IndexError.tooLong("id") }
        guard record.label.utf8.count <= 65_535 else { throw IndexError.tooLong("label") }
        records.append(record)
    }

    public mutating func removeAll() { records.removeAll() }

    /// The `top` most similar records to `query` (cosine), most similar first.
    public func search(_ query: [Float], top: Int) throws -> [(record: IndexRecord, similarity: Double)] {
        guard query.count == dimension else { throw IndexError.dimensionMismatch(expected: dimension, got: query.count) }
        return Classifiers.nearest(query, in: records.map(\.vector), k: top).map { (records[$0.index], $0.similarity) }
    }

    // ------------------------------------------------------------ bytes

    public func serialized() -> Data {
        var d = Data(Self.magic)
        d.appendLE(Self.version)
        d.appendLE(UInt32(dimension))
        d.append(contentsOf: Self.shaBytes(encoderSHA256)!)
        d.appendLE(UInt32(records.count))
        for r in records {
            for s in [r.id, r.label] {
                d.appendLE(UInt16(s.utf8.count))
                d.append(contentsOf: Array(s.utf8))
            }
            for v in r.vector { d.appendLE(v.bitPattern) }
        }
        d.appendLE(CRC32.checksum(d))
        return d
    }

    /// Parse a file's bytes; `expectedEncoder` (the loaded model's sha256) refuses an index of another model.
    public static func parse(_ data: Data, expectedEncoder: String? = nil) throws -> EmbeddingIndex {
        var r = Reader(data: data)
        guard data.count >= 4, Array(data.prefix(4)) == magic else { throw IndexError.notAnIndex("no EKIX magic") }
        r.offset = 4
        let version: UInt32 = try r.le("version")
        guard version == Self.version else { throw IndexError.unsupportedVersion(version) }
        let dim = Int(try r.le("dimension") as UInt32)
        let sha = try r.bytes(32, "encoder sha256").map { String(format: "%02x", $0) }.joined()
        let count = Int(try r.le("record count") as UInt32)
        guard dim > 0 else { throw IndexError.corrupt("dimension 0") }
        // The checksum first: a flipped byte anywhere is "corrupt", not a misleading field error further on.
        guard data.count >= r.offset + 4 else { throw IndexError.truncated("\(data.count) bytes") }
        let stored = UInt32(littleEndian: data.suffix(4).withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) })
        let body = data.prefix(data.count - 4)
        if CRC32.checksum(body) != stored {
            // A cut-off file fails the checksum too; tell the two apart by whether the records fit.
            throw Self.recordsFit(data, from: r.offset, count: count, dim: dim)
                ? IndexError.corrupt("checksum mismatch") : IndexError.truncated("\(count) records of \(dim)-d do not fit in \(data.count) bytes")
        }
        if let expectedEncoder, expectedEncoder.lowercased() != sha {
            throw IndexError.otherModel(file: sha, expected: expectedEncoder.lowercased())
        }
        var index = EmbeddingIndex(dimension: dim, encoderSHA256: sha)
        r.end = data.count - 4
        for _ in 0..<count {
            let id = try r.string("record id")
            let label = try r.string("record label")
            var v = [Float](repeating: 0, count: dim)
            for i in 0..<dim { v[i] = Float(bitPattern: try r.le("vector")) }
            do { try index.add(IndexRecord(id: id, label: label, vector: v)) } catch { throw IndexError.corrupt("\(error)") }
        }
        guard r.offset == r.end else { throw IndexError.corrupt("\(r.end - r.offset) bytes after the last record") }
        return index
    }

    static func recordsFit(_ data: Data, from start: Int, count: Int, dim: Int) -> Bool {
        var r = Reader(data: data, offset: start, end: data.count - 4)
        for _ in 0..<count {
            guard (try? r.string("")) != nil, (try? r.string("")) != nil, (try? r.bytes(4 * dim, "")) != nil else { return false }
        }
        return true
    }

    public static func load(from url: URL, expectedEncoder: String? = nil) throws -> EmbeddingIndex {
        try parse(Data(contentsOf: url), expectedEncoder: expectedEncoder)
    }

    /// Temp file + rename (Foundation's .atomic): the old file stays whole until the new one is complete.
    public func save(to url: URL) throws {
        try serialized().write(to: url, options: .atomic)
    }

    static func shaBytes(_ hex: String) -> [UInt8]? {
        let chars = Array(hex.lowercased())
        guard chars.count == 64 else { return nil }
        var out: [UInt8] = []
        for i in stride(from: 0, to: 64, by: 2) {
            guard let b = UInt8(String(chars[i...i + 1]), radix: 16) else { return nil }
            out.append(b)
        }
        return out
    }
}

/// Little-endian reads from a byte buffer; running past the end throws the caller's own error.
struct Reader {
    let data: Data
    var offset = 0
    var end: Int
    let short: (String) -> Error

    init(data: Data, offset: Int = 0, end: Int? = nil, short: @escaping (String) -> Error = { IndexError.truncated($0) }) {
        self.data = data
        self.offset = offset
        self.end = end ?? data.count
        self.short = short
    }

    mutating func bytes(_ n: Int, _ what: String) throws -> [UInt8] {
        guard n >= 0, offset >= 0, offset + n <= end else { throw short("\(what) at byte \(offset)") }
        let start = data.startIndex + offset
        offset += n
        return Array(data[start..<(start + n)])
    }

    mutating func le<T: FixedWidthInteger>(_ what: String) throws -> T {
        let b = try bytes(MemoryLayout<T>.size, what)
        return b.reversed().reduce(T(0)) { $0 << 8 | T($1) }
    }

    mutating func string(_ what: String) throws -> String {
        let n = Int(try le(what) as UInt16)
        guard let s = String(bytes: try bytes(n, what), encoding: .utf8) else { throw IndexError.corrupt("\(what) is not UTF-8") }
        return s
    }
}

extension Data {
    mutating func appendLE<T: FixedWidthInteger>(_ v: T) {
        Swift.withUnsafeBytes(of: v.littleEndian) { append(contentsOf: $0) }
    }
}

/// CRC-32 (IEEE 802.3, zlib's): Foundation has none, and a few lines beat a dependency.
enum CRC32 {
    static let table: [UInt32] = (0..<256).map { i -> UInt32 in
        var c = UInt32(i)
        for _ in 0..<8 { c = c & 1 != 0 ? 0xEDB8_8320 ^ (c >> 1) : c >> 1 }
        return c
    }

    static func checksum(_ data: Data) -> UInt32 {
        var c: UInt32 = 0xFFFF_FFFF
        for b in data { c = table[Int((c ^ UInt32(b)) & 0xFF)] ^ (c >> 8) }
        return c ^ 0xFFFF_FFFF
    }
}
