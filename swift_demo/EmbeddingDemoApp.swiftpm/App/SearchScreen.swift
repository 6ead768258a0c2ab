// A photo from the library against the stored ones: the ten nearest as thumbnails, kNN and centroid labels.
#if os(iOS)
import PhotosUI
import SwiftUI

struct SearchScreen: View {
    @EnvironmentObject var app: AppModel
    @State var item: PhotosPickerItem?
    @State var answer: DemoEngine.Answer?
    @State var error: String?

    var body: some View {
        NavigationStack {
            List {
                PhotosPicker("Pick a photo to search with", selection: $item, matching: .images).disabled((app.snapshot?.photos ?? 0) == 0)
                if let answer {
                    AnswerText(answer: answer)
                    NeighbourStrip(hits: answer.neighbours)
                    Text(String(format: "crop %.0f ms, embed %.0f ms, classify %.0f ms", answer.cropMs, answer.embedMs, answer.classifyMs)).font(.footnote)
                }
                if let error { Text(error).foregroundStyle(.red) }
            }
            .navigationTitle("Search")
            .onChange(of: item) { _, picked in
                guard let picked, let engine = app.engine else { return }
                Task {
                    do {
                        guard let data = try await picked.loadTransferable(type: Data.self) else { error = "the photo could not be read"; return }
                        answer = try await engine.search(photo: data, top: 10, threshold: app.threshold)
                        error = nil
                    } catch {
                        self.error = "\(error)"
                    }
                }
            }
        }
    }
}
#endif
