// Import a model, see its card, check it against encoder.json, run the self-test (golden crops on each compute
// unit with validate's gates, and Core ML's planned unit per operation). One .fileImporter serves both pickers:
// SwiftUI presents only one file importer per view, so two on one view open nothing or the wrong picker.
#if os(iOS)
import SwiftUI
import UniformTypeIdentifiers

struct ModelScreen: View {
    @EnvironmentObject var app: AppModel
    @State var picking = Picking.model
    @State var pickerShown = false

    enum Picking {
        case model, sidecar

        // iPadOS registers no type for .mlmodel / .mlpackage: any file (the import checks the name) or a folder
        // (an .mlpackage copied to Files is one).
        var types: [UTType] { self == .model ? [.data, .folder] : [.json] }
    }

    var body: some View {
        NavigationStack {
            List {
                Section("Model") {
                    Button("Import a model (.mlmodel, .mlpackage or its zip, .mlmodelc)") { pick(.model) }.disabled(app.busy != nil)
                    ForEach(app.snapshot?.card ?? [], id: \.0) { row in LabeledContent(row.0, value: row.1) }
                    if let choice = app.snapshot?.computeChoice { LabeledContent("loaded for", value: choice.rawValue) }
                    Button("Check against encoder.json") { pick(.sidecar) }.disabled(app.snapshot?.computeChoice == nil)
                    if let mismatches = app.mismatches {
                        if mismatches.isEmpty { Text("the model matches encoder.json").foregroundStyle(.green) }
                        ForEach(mismatches, id: \.self) { Text($0).foregroundStyle(.red) }
                    }
                }
                Section("Self-test: golden crops on each compute unit, validate's gates, planned unit per operation") {
                    Button("Run the self-test") { Task { await app.runSelfTest() } }.disabled(app.busy != nil || app.snapshot?.computeChoice == nil)
                    ForEach(Array(app.selfTest.enumerated()), id: \.offset) { item in
                        Text(item.element).font(.callout.monospaced()).foregroundStyle(item.element.contains("FAIL") ? Color.red : Color.primary)
                    }
                }
                if let busy = app.busy { Section { ProgressView(busy) } }
                Section { ForEach(Array(app.notes.enumerated()), id: \.offset) { item in Text(item.element).font(.footnote) } }
            }
            .navigationTitle("Embedding Demo")
            .fileImporter(isPresented: $pickerShown, allowedContentTypes: picking.types) { result in
                switch (picking, result) {
                case (_, .failure(let error)): app.notes = ["the picker failed: \(error.localizedDescription)"]
                case (.model, .success(let url)): Task { await app.importModel(url) }
                case (.sidecar, .success(let url)): Task { await app.checkSidecar(url) }
                }
            }
        }
    }

    func pick(_ what: Picking) {
        picking = what
        pickerShown = true
    }
}
#endif
