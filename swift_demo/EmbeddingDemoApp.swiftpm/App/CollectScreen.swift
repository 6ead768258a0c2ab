// Labelled photos from the library: one picker batch at a time (the picker is disabled while a batch runs, and the
// engine runs batches one after the other anyway), read with loadTransferable and handed to the engine whole.
#if os(iOS)
import PhotosUI
import SwiftUI

struct CollectScreen: View {
    @EnvironmentObject var app: AppModel
    @State var label = ""
    @State var items: [PhotosPickerItem] = []

    var body: some View {
        NavigationStack {
            Form {
                TextField("Label for the next photos", text: $label)
                PhotosPicker("Add photos with this label", selection: $items, matching: .images)
                    .disabled(label.isEmpty || app.snapshot?.computeChoice == nil || app.busy != nil)
                if let busy = app.busy { ProgressView(busy) }
                Section("Stored: \(app.snapshot?.photos ?? 0) photos") {
                    ForEach(app.snapshot?.classes ?? [], id: \.label) { c in LabeledContent(c.label, value: "\(c.photos) photos") }
                }
                Section { ForEach(Array(app.notes.enumerated()), id: \.offset) { item in Text(item.element).font(.footnote) } }
            }
            .navigationTitle("Collect")
            .onChange(of: items) { _, picked in
                guard !picked.isEmpty else { return }
                let label = self.label
                items = []
                Task {
                    var photos: [Data] = []
                    var unreadable = 0
                    for item in picked {
                        do {
                            if let data = try await item.loadTransferable(type: Data.self) { photos.append(data) } else { unreadable += 1 }
                        } catch {
                            unreadable += 1
                        }
                    }
                    await app.add(photos, unreadable: unreadable, label: label)
                }
            }
        }
    }
}
#endif
