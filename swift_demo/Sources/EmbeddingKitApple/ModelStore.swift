// Importing a model picked at run time (swift-chat's ModelLoader pattern): copy it out of the picker's security
// scope, unzip a .zip (the Files app cannot hand over an .mlpackage directory), compile it off the main thread with
// MLModel.compileModel(at:) — an .mlpackage recompiles on every load, a compiled .mlmodelc does not — and keep the
// compiled model in Application Support, replacing the previous one only once the new one compiled.
#if canImport(CoreML)
import CoreML
import EmbeddingKit
import Foundation

public struct ImportedModel: Sendable {
    public let compiledURL: URL
    public let metadata: ModelMetadata
    public let inputNames: [String]
    public let outputNames: [String]

    public var encoderSHA256: String? { metadata["encoder_sha256"] }
    public var imageSize: Int? { metadata.int("image_size") }
}

public enum ModelImportError: Error, CustomStringConvertible {
    case unsupported(String)
    case noModelInZip(String)
    case notAnEncoder(String)

    public var description: String {
        switch self {
        case .unsupported(let name): return "\(name): pick an .mlmodel, .mlpackage (zipped), .mlmodelc or .zip"
        case .noModelInZip(let name): return "\(name) holds no .mlmodel, .mlpackage or .mlmodelc"
        case .notAnEncoder(let why): return "not an encoder exported by the pipeline: \(why)"
        }
    }
}

public actor ModelStore {
    public let directory: URL
    var current: URL { directory.appendingPathComponent("encoder.mlmodelc", isDirectory: true) }

    public init(directory: URL? = nil) throws {
        let base = try directory ?? FileManager.default.url(for: .applicationSupportDirectory, in: .userDomainMask,
                                                            appropriateFor: nil, create: true)
        self.directory = base.appendingPathComponent("Models", isDirectory: true)
        try FileManager.default.createDirectory(at: self.directory, withIntermediateDirectories: true)
    }

    /// The model imported last, if any.
    public func installed() throws -> ImportedModel? {
        FileManager.default.fileExists(atPath: current.path) ? try Self.describe(current) : nil
    }

    public func importModel(from picked: URL) async throws -> ImportedModel {
        let scoped = picked.startAccessingSecurityScopedResource()
        defer { if scoped { picked.stopAccessingSecurityScopedResource() } }
        let fm = FileManager.default
        let work = fm.temporaryDirectory.appendingPathComponent("import-\(UUID().uuidString)", isDirectory: true)
        try fm.createDirectory(at: work, withIntermediateDirectories: true)
        defer { try? fm.removeItem(at: work) }

        var source = work.appendingPathComponent(picked.lastPathComponent)
        try fm.copyItem(at: picked, to: source)
        if source.pathExtension.lowercased() == "zip" {
            let unzipped = work.appendingPathComponent("unzipped", isDirectory: true)
            try ZipArchive(data: Data(contentsOf: source)).extract(into: unzipped, inflate: Inflate.raw)
            guard let found = Self.findModel(in: unzipped) else { throw ModelImportError.noModelInZip(picked.lastPathComponent) }
            source = found
        }
        let compiled: URL
        switch source.pathExtension.lowercased() {
        case "mlmodelc": compiled = source
        case "mlmodel", "mlpackage": compiled = try await MLModel.compileModel(at: source)  // off the main actor
        default: throw ModelImportError.unsupported(picked.lastPathComponent)
        }
        let described = try Self.describe(compiled)
        guard described.encoderSHA256 != nil, described.imageSize != nil else {
            throw ModelImportError.notAnEncoder("its metadata has no encoder_sha256 / image_size")
        }
        // Stage beside the old model, then swap: a failure above or here leaves the previous model in place.
        let staged = directory.appendingPathComponent("incoming-\(UUID().uuidString).mlmodelc", isDirectory: true)
        try fm.copyItem(at: compiled, to: staged)
        if fm.fileExists(atPath: current.path) {
            _ = try fm.replaceItemAt(current, withItemAt: staged)
        } else {
            try fm.moveItem(at: staged, to: current)
        }
        return try Self.describe(current)
    }

    static func findModel(in folder: URL) -> URL? {
        let walker = FileManager.default.enumerator(at: folder, includingPropertiesForKeys: nil)
        while let url = walker?.nextObject() as? URL {
            if ["mlmodelc", "mlpackage", "mlmodel"].contains(url.pathExtension.lowercased()) { return url }
        }
        return nil
    }

    /// Metadata and feature names, read with the CPU only (loading never fails for want of a unit).
    public static func describe(_ compiled: URL) throws -> ImportedModel {
        let config = MLModelConfiguration()
        config.computeUnits = .cpuOnly
        let d = try MLModel(contentsOf: compiled, configuration: config).modelDescription
        let user = d.metadata[MLModelMetadataKey.creatorDefinedKey] as? [String: String] ?? [:]
        return ImportedModel(compiledURL: compiled, metadata: ModelMetadata(user),
                             inputNames: d.inputDescriptionsByName.keys.sorted(), outputNames: d.outputDescriptionsByName.keys.sorted())
    }
}
#endif
