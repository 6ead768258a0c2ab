// The app's store of labelled embeddings and its brute-force search (a few thousand photos: a linear scan of
// 512-d dot products takes well under a frame).
//
// File format, version 2, little-endian. A header, then one frame per record, so that adding photos appends frames
// (IndexFile) instead of rewriting the file, and a whole save writes exactly the bytes the appends would have:
//   header, 48 bytes: "EKIX" magic, UInt32 version, UInt32 dimension, 32 B sha256 of the encoder.pt the embeddings
//           were made with (the model's `encoder_sha256`), UInt32 CRC-32 of the 44 bytes before it
//   frame:  UInt32 payload length n, n bytes of payload (UInt16 id length, id UTF-8, UInt16 label length,
//           label UTF-8, dimension x Float32), UInt32 CRC-32 of the length and the payload
// A frame counts only if it and every frame before it is whole (a write-ahead log's rule, as SQLite's WAL): a
// crash mid-append leaves a torn last frame, which a reader drops and reports in `droppedBytes`. A bad header
// (not an index, another version, another model, a failed CRC) is an error, and the file is left as it is.

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
    public static let version: UInt32 = 2

    public let dimension: Int
    public let encoderSHA256: String  // 64 hex digits
    public private(set) var records: [IndexRecord] = []
    var ids: Set<String> = []  // a duplicate check in O(1): loading thousands of records stays linear

    public init(dimension: Int, encoderSHA256: String) {
        precondition(dimension > 0, "dimension must be positive")
        precondition(Self.shaBytes(encoderSHA256) != nil, "encoder sha256 must be 64 hex digits")
        self.dimension = dimension
        self.encoderSHA256 = encoderSHA256.lowercased()
    }

    public mutating func add(_ record: IndexRecord) throws {
        try check(record)
        records.append(record)
        ids.insert(record.id)
    }

    /// Why `record` cannot be added, if it cannot.
    public func check(_ record: IndexRecord) throws {
        guard record.vector.count == dimension else { throw IndexError.dimensionMismatch(expected: dimension, got: record.vector.count) }
        guard !ids.contains(record.id) else { throw IndexError.duplicateID(record.id) }
        guard record.id.utf8.count <= 65_535 else { throw IndexError.tooLong("id") }
        guard record.label.utf8.count <= 65_535 else { throw IndexError.tooLong("label") }
    }

    /// The `top` most similar records to `query` (cosine), most similar first.
    public func search(_ query: [Float], top: Int) throws -> [(record: IndexRecord, similarity: Double)] {
        guard query.count == dimension else { throw IndexError.dimensionMismatch(expected: dimension, got: query.count) }
        return Classifiers.nearest(query, in: records.map(\.vector), k: top).map { (records[$0.index], $0.similarity) }
    }

    // ------------------------------------------------------------ bytes

    public static let headerSize = 48

    /// The whole file: header, then one frame per record, in order.
    public func serialized() -> Data {
        var d = header()
        for r in records { d.append(Self.frame(r)) }
        return d
    }

    func header() -> Data {
        var d = Data(Self.magic)
        d.appendLE(Self.version)
        d.appendLE(UInt32(dimension))
        d.append(contentsOf: Self.shaBytes(encoderSHA256)!)
        d.appendLE(CRC32.checksum(d))
        return d
    }

    static func frame(_ r: IndexRecord) -> Data {
        var payload = Data()
        for s in [r.id, r.label] {
            payload.appendLE(UInt16(s.utf8.count))
            payload.append(contentsOf: Array(s.utf8))
        }
        for v in r.vector { payload.appendLE(v.bitPattern) }
        var d = Data()
        d.appendLE(UInt32(payload.count))
        d.append(payload)
        d.appendLE(CRC32.checksum(d))
        return d
    }

    /// A file's records up to the first frame that is not whole, and how many bytes after it were dropped.
    public struct Parsed: Sendable {
        public let index: EmbeddingIndex
        /// Bytes of the header and the whole frames: where the next append goes.
        public let validLength: Int
        /// Bytes after the last whole frame (a torn append); 0 for a file written to the end.
        public var droppedBytes: Int
    }

    /// Parse a file's bytes; `expectedEncoder` (the loaded model's sha256) refuses an index of another model.
    public static func parse(_ data: Data, expectedEncoder: String? = nil) throws -> Parsed {
        guard data.count >= 4, Array(data.prefix(4)) == magic else { throw IndexError.notAnIndex("no EKIX magic") }
        guard data.count >= headerSize else { throw IndexError.truncated("\(data.count) bytes, the header alone is \(headerSize)") }
        var r = Reader(data: data, offset: 4)
        let version: UInt32 = try r.le("version")
        guard version == Self.version else { throw IndexError.unsupportedVersion(version) }
        let dim = Int(try r.le("dimension") as UInt32)
        let sha = try r.bytes(32, "encoder sha256").map { String(format: "%02x", $0) }.joined()
        let stored: UInt32 = try r.le("header checksum")
        guard CRC32.checksum(data.prefix(headerSize - 4)) == stored else { throw IndexError.corrupt("header checksum mismatch") }
        guard dim > 0 else { throw IndexError.corrupt("dimension 0") }
        if let expectedEncoder, expectedEncoder.lowercased() != sha {
            throw IndexError.otherModel(file: sha, expected: expectedEncoder.lowercased())
        }
        var index = EmbeddingIndex(dimension: dim, encoderSHA256: sha)
        var valid = headerSize
        while let (record, next) = frame(in: data, at: valid, dimension: dim) {
            guard (try? index.add(record)) != nil else { break }  // a repeated id is damage, like a bad checksum
            valid = next
        }
        return Parsed(index: index, validLength: valid, droppedBytes: data.count - valid)
    }

    /// The whole frame at `start` and where the next one begins; nil if it is cut off or damaged.
    static func frame(in data: Data, at start: Int, dimension: Int) -> (IndexRecord, Int)? {
        var r = Reader(data: data, offset: start)
        guard let n = try? r.le("frame length") as UInt32, Int(n) <= data.count - start - 8 else { return nil }
        let end = start + 4 + Int(n)
        let crcStart = data.startIndex + start
        var tail = Reader(data: data, offset: end)
        guard let stored = try? tail.le("frame checksum") as UInt32,
              CRC32.checksum(data[crcStart..<(crcStart + 4 + Int(n))]) == stored else { return nil }
        r.end = end
        guard let id = try? r.string("id"), let label = try? r.string("label"), r.end - r.offset == 4 * dimension,
              let raw = try? r.bytes(4 * dimension, "vector") else { return nil }
        let v = (0..<dimension).map { i in
            Float(bitPattern: UInt32(raw[4 * i]) | UInt32(raw[4 * i + 1]) << 8 | UInt32(raw[4 * i + 2]) << 16 | UInt32(raw[4 * i + 3]) << 24)
        }
        return (IndexRecord(id: id, label: label, vector: v), end + 4)
    }

    public static func load(from url: URL, expectedEncoder: String? = nil) throws -> EmbeddingIndex {
        try parse(Data(contentsOf: url), expectedEncoder: expectedEncoder).index
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
