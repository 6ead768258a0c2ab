// The index file kept open for appends: adding a batch of photos writes their frames at the end of the file and
// syncs (EmbeddingIndex's version-2 format), instead of rewriting every stored record after each photo (0.6 s at
// 5k records). A torn last append (the app killed mid-write) is dropped when the file is opened, and the file as it
// was is kept beside it (NAME.damaged) before the next append cuts it back to its last whole frame.

import Foundation

public final class IndexFile {
    public let url: URL
    public private(set) var index: EmbeddingIndex
    /// Bytes dropped from the end when the file was opened; 0 for a file written to the end.
    public let droppedBytes: Int
    /// Where the next frame goes: the header and the whole frames.
    private var length: Int

    /// Opens the file, or creates an empty index of `dimension` for `encoderSHA256`. A file of another model
    /// (IndexError.otherModel) or of another dimension is an error and is left as it is.
    public init(url: URL, dimension: Int, encoderSHA256: String) throws {
        self.url = url
        guard FileManager.default.fileExists(atPath: url.path) else {
            index = EmbeddingIndex(dimension: dimension, encoderSHA256: encoderSHA256)
            try index.save(to: url)
            length = EmbeddingIndex.headerSize
            droppedBytes = 0
            return
        }
        let data = try Data(contentsOf: url)
        let parsed = try EmbeddingIndex.parse(data, expectedEncoder: encoderSHA256)
        guard parsed.index.dimension == dimension else {
            throw IndexError.dimensionMismatch(expected: parsed.index.dimension, got: dimension)
        }
        index = parsed.index
        length = parsed.validLength
        droppedBytes = parsed.droppedBytes
        if droppedBytes > 0 { try data.write(to: url.appendingPathExtension("damaged"), options: .atomic) }
    }

    /// Replaces the file by `index`, written whole (temp file + rename): a re-embed with another model.
    public init(url: URL, replacingWith index: EmbeddingIndex) throws {
        let data = index.serialized()
        try data.write(to: url, options: .atomic)
        self.url = url
        self.index = index
        length = data.count
        droppedBytes = 0
    }

    /// Adds `records` to the index and the file: every record is checked before a byte is written, then one write
    /// and one sync. On a thrown error nothing is added (the next append cuts whatever a failed write left).
    public func append(_ records: [IndexRecord]) throws {
        var grown = index
        var bytes = Data()
        for r in records {
            try grown.add(r)
            bytes.append(EmbeddingIndex.frame(r))
        }
        let handle = try FileHandle(forWritingTo: url)
        defer { try? handle.close() }  // the sync below already reported whether the bytes are on disk
        try handle.truncate(atOffset: UInt64(length))
        try handle.seek(toOffset: UInt64(length))
        try handle.write(contentsOf: bytes)
        try handle.synchronize()
        length += bytes.count
        index = grown
    }
}
