// Installed models, replaced only by one known to work. Each compiled model lives in a folder of its own
// (Models/UUID.mlmodelc) and the file Models/current names the installed one. An import stages its model in a new
// folder; the app loads it and checks it there; only then does `install` rewrite `current` (temp file + rename), so
// a model that fails to load or to pass its check, or a crash on the way, leaves the previous model installed.
// Folders other than the installed one are removed at the next launch (`removeStale`), never while a loaded model
// may still read its files.

import Foundation

public struct ModelDirectory: Sendable {
    public let folder: URL
    var pointer: URL { folder.appendingPathComponent("current") }

    public init(folder: URL) throws {
        self.folder = folder
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    }

    /// The installed model's folder; nil before the first install (or if its folder is gone). A pointer that exists
    /// but cannot be read is an error, never "nothing installed": removeStale would then remove the model.
    public func installed() throws -> URL? {
        guard FileManager.default.fileExists(atPath: pointer.path) else { return nil }
        let name = String(decoding: try Data(contentsOf: pointer), as: UTF8.self)
        guard !name.isEmpty, !name.contains("/") else { throw ModelDirectoryError.badPointer(name) }
        let url = folder.appendingPathComponent(name, isDirectory: true)
        return FileManager.default.fileExists(atPath: url.path) ? url : nil
    }

    /// Moves `compiled` (a compiled model, e.g. MLModel.compileModel's output) into a new folder of its own.
    public func stage(_ compiled: URL) throws -> URL {
        let ext = compiled.pathExtension.isEmpty ? "" : "." + compiled.pathExtension
        let staged = folder.appendingPathComponent(UUID().uuidString + ext, isDirectory: true)
        try FileManager.default.moveItem(at: compiled, to: staged)
        return staged
    }

    /// Makes `staged` the installed model. The previous one's folder stays until `removeStale`.
    public func install(_ staged: URL) throws {
        guard staged.deletingLastPathComponent().standardizedFileURL.path == folder.standardizedFileURL.path,
              FileManager.default.fileExists(atPath: staged.path) else {
            throw ModelDirectoryError.notStaged(staged.path)
        }
        try Data(staged.lastPathComponent.utf8).write(to: pointer, options: .atomic)
    }

    /// Removes a staged model that failed; the installed one is never removed.
    public func discard(_ staged: URL) {
        do {
            guard try installed()?.standardizedFileURL.path != staged.standardizedFileURL.path else { return }
            try FileManager.default.removeItem(at: staged)
        } catch {
            // Left in place: the next removeStale removes every folder but the installed one.
        }
    }

    /// Every folder but the installed model's: staged models of failed or interrupted imports, replaced models.
    public func removeStale() throws {
        let keep = try installed()?.lastPathComponent
        for name in try FileManager.default.contentsOfDirectory(atPath: folder.path) where name != "current" && name != keep {
            try FileManager.default.removeItem(at: folder.appendingPathComponent(name))
        }
    }
}

public enum ModelDirectoryError: Error, CustomStringConvertible, Equatable {
    case notStaged(String)
    case badPointer(String)

    public var description: String {
        switch self {
        case .notStaged(let path): return "\(path) is not a model staged in the models folder"
        case .badPointer(let name): return "the models folder's pointer names \"\(name)\", not a model folder"
        }
    }
}
