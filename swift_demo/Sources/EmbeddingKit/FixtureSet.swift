// A folder of images as raw pixel buffers plus their embeddings and the pipeline's answers for them, as
// `pipeline swift-fixtures` writes it (manifest.json, raw.u8, crops.u8, embeddings.f32, ...). It is what the tests
// pin the port to, and what the `embedding-demo` tool runs on.

import Foundation

public struct FixtureSet: Sendable {
    public struct BankEntry: Decodable, Sendable {
        public let id: Int
        public let source: String
        public let label: Int
    }

    public struct Query: Decodable, Sendable {
        public let id: Int
        public let source: String
        public let label: Int
        public let width: Int
        public let height: Int
        public let layout: PixelLayout
        public let orientation: Int
        public let alpha: String?
        public let rawOffset: Int
        public let rawBytes: Int
    }

    public struct Expected: Decodable, Sendable {
        public struct Row: Decodable, Sendable {
            public let knnLabel: Int
            public let knnScores: [Double]
            public let majorityLabel: Int
            public let majorityVotes: [Int]
            public let centroidLabel: Int?
            public let centroidNearest: Int
            public let centroidCosine: Double
            public let topIds: [Int]
            public let topSimilarities: [Double]
        }

        public let weightedK: Int
        public let temperature: Double
        public let majorityK: Int
        public let centroidThreshold: Double
        public let queries: [Row]
    }

    public struct ParityCase: Decodable, Sendable {
        public let worstCosine: Double
        public let meanCosine: Double
        public let worstRelL2: Double
        public let meanRelL2: Double
        public let maxAbs: Double
        public let topK: Int
        public let topkAgreement: Double?
        public let failsFp32: Bool
        public let failsFp16: Bool
        public let failsCompressed: Bool

        /// The pipeline's verdict under one precision's gates.
        public func fails(_ precision: Precision) -> Bool {
            switch precision {
            case .fp32: return failsFp32
            case .fp16: return failsFp16
            case .compressed: return failsCompressed
            }
        }
    }

    /// validate's default bounds (export/configs.py's ValidateConfig) that an embedding alone can be held to.
    public struct Gates: Decodable, Sendable {
        public let fp32MaxAbs: Double
        public let fp32MinCosine: Double
        public let fp16MaxRelL2: Double
        public let fp16MinTopk: Double
        public let compressedMinTopk: Double
        public let compressedMinCosine: Double
    }

    public struct ParityExpected: Decodable, Sendable {
        public let gates: Gates
        public let topK: Int
        public let variants: [String: ParityCase]
    }

    public struct Manifest: Decodable, Sendable {
        public let formatVersion: Int
        public let imageSize: Int
        public let embeddingDim: Int
        public let encoderSha256: String
        public let classes: [String]
        public let bank: [BankEntry]
        public let queries: [Query]
        public let expected: Expected
        public let parity: ParityExpected
    }

    public static let formatVersion = 2

    public let folder: URL
    public let manifest: Manifest
    public let bankEmbeddings: [[Float]]
    public let queryEmbeddings: [[Float]]
    let raw: Data
    let crops: Data

    public init(folder: URL) throws {
        self.folder = folder
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        let m = try decoder.decode(Manifest.self, from: Data(contentsOf: folder.appendingPathComponent("manifest.json")))
        guard m.formatVersion == Self.formatVersion else {
            throw FixtureError("fixtures are format \(m.formatVersion), this reads \(Self.formatVersion): regenerate with `make swift-fixtures`")
        }
        manifest = m
        let rows = Vectors.rows(try Self.floats(folder, "embeddings.f32"), dimension: m.embeddingDim)
        guard rows.count == m.bank.count + m.queries.count else {
            throw FixtureError("embeddings.f32 has \(rows.count) rows for \(m.bank.count) bank + \(m.queries.count) queries")
        }
        bankEmbeddings = Array(rows[..<m.bank.count])
        queryEmbeddings = Array(rows[m.bank.count...])
        raw = try Data(contentsOf: folder.appendingPathComponent("raw.u8"))
        crops = try Data(contentsOf: folder.appendingPathComponent("crops.u8"))
    }

    static func floats(_ folder: URL, _ name: String) throws -> [Float] {
        Vectors.floats(fromLittleEndian: try Data(contentsOf: folder.appendingPathComponent(name)))
    }

    public func parityVariant(_ name: String) throws -> [[Float]] {
        Vectors.rows(try Self.floats(folder, "parity_\(name).f32"), dimension: manifest.embeddingDim)
    }

    /// Query i's pixels as a decoder hands them over.
    public func buffer(_ i: Int) throws -> (PixelBuffer, ExifOrientation) {
        let q = manifest.queries[i]
        let bytes = [UInt8](raw[(raw.startIndex + q.rawOffset)..<(raw.startIndex + q.rawOffset + q.rawBytes)])
        guard let o = ExifOrientation(rawValue: q.orientation) else { throw FixtureError("query \(i): orientation \(q.orientation)") }
        return (try PixelBuffer(width: q.width, height: q.height, layout: q.layout, bytes: bytes), o)
    }

    /// Query i after the pipeline's decode_image.
    public func expectedCrop(_ i: Int) -> RGBImage {
        let s = manifest.imageSize, n = s * s * 3
        let start = crops.startIndex + i * n
        return RGBImage(width: s, height: s, pixels: [UInt8](crops[start..<(start + n)]))
    }

    public var bankLabels: [Int] { manifest.bank.map(\.label) }

    /// The bank as an index, labels by class name.
    public func bankIndex() throws -> EmbeddingIndex {
        var index = EmbeddingIndex(dimension: manifest.embeddingDim, encoderSHA256: manifest.encoderSha256)
        for (entry, v) in zip(manifest.bank, bankEmbeddings) {
            try index.add(IndexRecord(id: "bank-\(entry.id)", label: manifest.classes[entry.label], vector: v))
        }
        return index
    }
}

public struct FixtureError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
