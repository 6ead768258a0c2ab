import EmbeddingKit
import Foundation
import XCTest

/// A palettized model (`pipeline export --compress palettize-4`) loads like any other: golden files in
/// FixturesPalettized/ are a tiny run's encoder.json, listing several compressions of each format side by side, and
/// the user_defined_metadata of its encoder.palettize-4.mlpackage.
final class CompressedModelTests: XCTestCase {
    struct ModelFile: Decodable {
        let userDefinedMetadata: [String: String]
        let inputNames: [String]
        let outputNames: [String]
    }

    let folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("FixturesPalettized")

    func model() throws -> ModelFile {
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return try decoder.decode(ModelFile.self, from: Data(contentsOf: folder.appendingPathComponent("model_metadata.json")))
    }

    /// encoder.json with the `encoder_sha256` of the artifact `file` replaced.
    func sidecar(changing file: String? = nil) throws -> EncoderSidecar {
        var json = try JSONSerialization.jsonObject(with: Data(contentsOf: folder.appendingPathComponent("encoder.json"))) as! [String: Any]
        var artifacts = json["artifacts"] as! [[String: Any]]
        for i in artifacts.indices where artifacts[i]["file"] as? String == file {
            artifacts[i]["encoder_sha256"] = String(repeating: "0", count: 64)
        }
        json["artifacts"] = artifacts
        return try EncoderSidecar.parse(JSONSerialization.data(withJSONObject: json))
    }

    func testAPalettizedModelPassesTheMetadataCheckAndSaysItsWeights() throws {
        let m = try model()
        let meta = ModelMetadata(m.userDefinedMetadata)
        let side = try sidecar()
        XCTAssertEqual(MetadataCheck.mismatches(model: meta, sidecar: side, inputNames: m.inputNames, outputNames: m.outputNames), [])
        XCTAssertEqual(Dictionary(uniqueKeysWithValues: meta.card)["weights"], "palettize-4")
        XCTAssertEqual(side.artifacts.filter { $0.format == "mlpackage" }.count, 5)
        XCTAssertEqual(side.artifacts.first { $0.file == "encoder.palettize-4.mlpackage" }?.compression, "palettize-4")
    }

    func testTheModelIsCheckedAgainstItsOwnCompressionsEntry() throws {
        let meta = ModelMetadata(try model().userDefinedMetadata)
        // another compression of the same format made from another encoder says nothing about this file
        XCTAssertEqual(MetadataCheck.mismatches(model: meta, sidecar: try sidecar(changing: "encoder.mlpackage")), [])
        let lines = MetadataCheck.mismatches(model: meta, sidecar: try sidecar(changing: "encoder.palettize-4.mlpackage"))
        XCTAssertEqual(lines.count, 1)
        XCTAssertTrue(lines[0].hasPrefix("artifact: encoder.json lists the mlpackage (palettize-4) as made from encoder 000000000000"), lines[0])
    }
}
