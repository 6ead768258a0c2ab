// Just enough of ZIP to unpack a model the Files app hands over: an .mlpackage is a directory, so it travels zipped.
// Foundation has no unzip on iOS and the package takes no dependencies; the central directory is read here, stored
// entries are copied, deflated ones go through an injected raw-inflate (Apple's Compression in EmbeddingKitApple).
// Every entry's CRC-32 is checked; names that would escape the target folder are refused. No ZIP64, no encryption.

import Foundation

public enum ZipError: Error, CustomStringConvertible, Equatable {
    case notAZip
    case unsupported(String)
    case corrupt(String)
    case unsafePath(String)
    case noModel
    case severalModels([String])

    public var description: String {
        switch self {
        case .notAZip: return "not a zip file (no end-of-central-directory record)"
        case .unsupported(let what): return "unsupported zip: \(what)"
        case .corrupt(let what): return "corrupt zip: \(what)"
        case .unsafePath(let name): return "zip entry \(name) would be written outside the target folder"
        case .noModel: return "the zip holds no .mlpackage, .mlmodelc or .mlmodel"
        case .severalModels(let roots): return "the zip holds \(roots.count) models (\(roots.joined(separator: ", "))): zip one"
        }
    }
}

public struct ZipArchive {
    public struct Entry: Equatable {
        public let name: String
        public let method: UInt16  // 0 stored, 8 deflate
        public let crc32: UInt32
        public let compressedSize: Int
        public let size: Int
        let localHeaderOffset: Int
        public var isDirectory: Bool { name.hasSuffix("/") }
    }

    public let entries: [Entry]
    let data: Data
    static let truncated: (String) -> Error = { ZipError.corrupt("truncated: \($0)") }

    public init(data: Data) throws {
        self.data = data
        var r = Reader(data: data, short: Self.truncated)
        guard data.count >= 22 else { throw ZipError.notAZip }
        // The end-of-central-directory record: 22 bytes plus a comment of up to 65,535, so searched backwards.
        var eocd: Int?
        var p = data.count - 22
        while p >= max(0, data.count - 22 - 65_535) {
            var probe = Reader(data: data, offset: p, short: Self.truncated)
            if (try? probe.le("") as UInt32) == 0x0605_4B50 { eocd = p; break }
            p -= 1
        }
        guard let eocd else { throw ZipError.notAZip }
        r.offset = eocd + 10
        let count = Int(try r.le("entry count") as UInt16)
        _ = try r.le("central directory size") as UInt32
        let cdOffset = Int(try r.le("central directory offset") as UInt32)
        if count == 0xFFFF || cdOffset == 0xFFFF_FFFF { throw ZipError.unsupported("ZIP64") }
        r.offset = cdOffset
        var entries: [Entry] = []
        for _ in 0..<count {
            guard (try r.le("central header") as UInt32) == 0x0201_4B50 else { throw ZipError.corrupt("central directory header") }
            r.offset += 4
            let flags: UInt16 = try r.le("flags")
            let method: UInt16 = try r.le("method")
            r.offset += 4
            let crc: UInt32 = try r.le("crc")
            let csize = Int(try r.le("compressed size") as UInt32)
            let size = Int(try r.le("size") as UInt32)
            let nameLen = Int(try r.le("name length") as UInt16)
            let extraLen = Int(try r.le("extra length") as UInt16)
            let commentLen = Int(try r.le("comment length") as UInt16)
            r.offset += 8
            let local = Int(try r.le("local header offset") as UInt32)
            guard let name = String(bytes: try r.bytes(nameLen, "name"), encoding: .utf8) else { throw ZipError.corrupt("entry name") }
            r.offset += extraLen + commentLen
            if flags & 1 != 0 { throw ZipError.unsupported("encrypted entry \(name)") }
            if method != 0 && method != 8 { throw ZipError.unsupported("compression method \(method) in \(name)") }
            entries.append(Entry(name: name, method: method, crc32: crc, compressedSize: csize, size: size, localHeaderOffset: local))
        }
        self.entries = entries
    }

    /// An entry's bytes, inflated and CRC-checked.
    public func contents(of e: Entry, inflate: (Data, Int) throws -> Data) throws -> Data {
        var r = Reader(data: data, offset: e.localHeaderOffset, short: Self.truncated)
        guard (try r.le("local header") as UInt32) == 0x0403_4B50 else { throw ZipError.corrupt("local header of \(e.name)") }
        r.offset = e.localHeaderOffset + 26
        let nameLen = Int(try r.le("name length") as UInt16)
        let extraLen = Int(try r.le("extra length") as UInt16)
        r.offset += nameLen + extraLen
        let raw = Data(try r.bytes(e.compressedSize, "data of \(e.name)"))
        let out = e.method == 0 ? raw : try inflate(raw, e.size)
        guard out.count == e.size, CRC32.checksum(out) == e.crc32 else { throw ZipError.corrupt("\(e.name) fails its CRC-32") }
        return out
    }

    /// Every entry under `folder` (which is created), or only those `keep` accepts.
    public func extract(into folder: URL, inflate: (Data, Int) throws -> Data, keep: (Entry) -> Bool = { _ in true }) throws {
        let fm = FileManager.default
        try fm.createDirectory(at: folder, withIntermediateDirectories: true)
        for e in entries where keep(e) {
            let parts = e.name.split(separator: "/")
            if e.name.hasPrefix("/") || parts.contains("..") { throw ZipError.unsafePath(e.name) }
            let target = parts.reduce(folder) { $0.appendingPathComponent(String($1)) }
            if e.isDirectory {
                try fm.createDirectory(at: target, withIntermediateDirectories: true)
            } else {
                try fm.createDirectory(at: target.deletingLastPathComponent(), withIntermediateDirectories: true)
                try contents(of: e, inflate: inflate).write(to: target, options: .atomic)
            }
        }
    }

    /// The one model the zip holds (ModelInArchive.root), extracted alone under `folder`; its URL there.
    public func extractModel(into folder: URL, inflate: (Data, Int) throws -> Data) throws -> URL {
        guard let root = try ModelInArchive.root(entries.map(\.name)) else { throw ZipError.noModel }
        try extract(into: folder, inflate: inflate) { $0.name == root || $0.name.hasPrefix(root + "/") }
        return root.split(separator: "/").reduce(folder) { $0.appendingPathComponent(String($1)) }
    }

    /// For callers without a deflate implementation (Linux tests): deflated entries are an error, not garbage.
    public static func storedOnly(_ data: Data, _ size: Int) throws -> Data {
        throw ZipError.unsupported("deflated entry: no inflater on this platform")
    }
}

/// Which entry of a zip is the model. A zip made by the Finder holds a `__MACOSX/` twin of every folder
/// (`__MACOSX/encoder.mlpackage/._Manifest.json`: resource forks, not a model), and an .mlpackage itself holds
/// `Data/com.apple.CoreML/model.mlmodel`: so the model is the outermost folder or file named like one, outside
/// `__MACOSX/` and hidden (`.`-prefixed, `._` AppleDouble) entries, and nothing inside it is looked at.
public enum ModelInArchive {
    public static let extensions: Set<String> = ["mlpackage", "mlmodelc", "mlmodel"]

    /// The model's path inside the archive (no trailing slash); nil when there is none; several is an error.
    public static func root(_ names: [String]) throws -> String? {
        var roots: [String] = []
        for name in names {
            let parts = name.split(separator: "/").map(String.init)
            if parts.contains(where: { $0 == "__MACOSX" || $0.hasPrefix(".") }) { continue }
            guard let i = parts.firstIndex(where: { extensions.contains(($0 as NSString).pathExtension.lowercased()) }) else { continue }
            let root = parts[...i].joined(separator: "/")
            if !roots.contains(root) { roots.append(root) }
        }
        if roots.count > 1 { throw ZipError.severalModels(roots) }
        return roots.first
    }
}
