// A model picked in the Files app, made ready for DemoEngine.install(staged:): copied out of the picker's security
// scope, unzipped (the Files app hands over a directory such as an .mlpackage only as a folder or a zip), the model
// inside chosen by its path (EmbeddingKit's ModelInArchive: never the __MACOSX twin, never the model.mlmodel inside
// an .mlpackage), compiled with MLModel.compileModel(at:) (an .mlpackage recompiles on every load, a compiled
// .mlmodelc does not), and moved into a folder of its own in the models folder. Nothing is installed here.
#if canImport(CoreML)
import CoreML
#if canImport(EmbeddingKit)
import EmbeddingKit
#endif
import Foundation

public enum ModelImport {
    public static func stage(_ picked: URL, into models: ModelDirectory) async throws -> URL {
        try await Task.detached { try await ModelImport.stageNow(picked, models) }.value  // copying and unzipping: never on the main actor
    }

    static func stageNow(_ picked: URL, _ models: ModelDirectory) async throws -> URL {
        let scoped = picked.startAccessingSecurityScopedResource()
        defer { if scoped { picked.stopAccessingSecurityScopedResource() } }
        let fm = FileManager.default
        let work = fm.temporaryDirectory.appendingPathComponent("import-\(UUID().uuidString)", isDirectory: true)
        try fm.createDirectory(at: work, withIntermediateDirectories: true)
        defer { try? fm.removeItem(at: work) }  // a temporary folder; the OS clears it too

        let copied = work.appendingPathComponent(picked.lastPathComponent)
        try fm.copyItem(at: picked, to: copied)
        var source = copied
        var isFolder: ObjCBool = false
        if copied.pathExtension.lowercased() == "zip" {
            source = try ZipArchive(data: Data(contentsOf: copied, options: .alwaysMapped))
                .extractModel(into: work.appendingPathComponent("unzipped", isDirectory: true), inflate: Inflate.raw)
        } else if fm.fileExists(atPath: copied.path, isDirectory: &isFolder), isFolder.boolValue,
                  !ModelInArchive.extensions.contains(copied.pathExtension.lowercased()) {
            // A folder holding the model (an export/ folder): the same choice as inside a zip.
            let names = fm.subpaths(atPath: copied.path) ?? []
            guard let root = try ModelInArchive.root(names) else { throw ZipError.noModel }
            source = copied.appendingPathComponent(root)
        }
        let compiled: URL
        switch source.pathExtension.lowercased() {
        case "mlmodelc": compiled = source
        case "mlmodel", "mlpackage": compiled = try await MLModel.compileModel(at: source)
        default: throw EngineError.notAnEncoder("\(picked.lastPathComponent): pick an .mlmodel, an .mlpackage (or its zip), an .mlmodelc or a folder holding one")
        }
        return try models.stage(compiled)
    }
}
#endif
