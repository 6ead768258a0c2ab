import EmbeddingKit
import Foundation
import XCTest

final class MetadataTests: XCTestCase {
    struct ModelFile: Decodable {
        let userDefinedMetadata: [String: String]
        let inputNames: [String]
        let outputNames: [String]
    }

    func fixtures() throws -> (EncoderSidecar, ModelFile) {
        let sidecar = try EncoderSidecar.parse(Data(contentsOf: fixturesFolder.appendingPathComponent("encoder.json")))
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        let model = try decoder.decode(ModelFile.self, from: Data(contentsOf: fixturesFolder.appendingPathComponent("model_metadata.json")))
        return (sidecar, model)
    }

    func testTheExportedModelAgreesWithItsSidecar() throws {
        let (sidecar, model) = try fixtures()
        let meta = ModelMetadata(model.userDefinedMetadata)
        XCTAssertEqual(MetadataCheck.mismatches(model: meta, sidecar: sidecar, inputNames: model.inputNames, outputNames: model.outputNames), [])
        XCTAssertEqual(meta.int("embedding_dim"), sidecar.embeddingDim)
        XCTAssertEqual(meta.bool("l2_normalized"), true)
        XCTAssertEqual(sidecar.visionCropAndScale, "centerCrop")
        let card = Dictionary(uniqueKeysWithValues: meta.card)
        XCTAssertEqual(card["method"], sidecar.method)
        XCTAssertTrue(card["embedding"]!.hasPrefix("\(sidecar.embeddingDim)-d"))
        XCTAssertNotNil(card["precision"])
    }

    func testEachMismatchIsOneLineNamingIt() throws {
        let (sidecar, model) = try fixtures()
        let changes: [(String, String)] = [("embedding_dim", "7"), ("image_size", "999"), ("encoder_sha256", String(repeating: "0", count: 64)),
                                           ("l2_normalized", "false"), ("vision_crop_and_scale", "scaleFill"),
                                           ("input_name", "pixels"), ("output_name", "features")]
        for (key, value) in changes {
            var values = model.userDefinedMetadata
            values[key] = value
            let lines = MetadataCheck.mismatches(model: ModelMetadata(values), sidecar: sidecar)
            XCTAssertEqual(lines.count, key == "encoder_sha256" ? 2 : 1, "\(key): \(lines)")  // the sha also disagrees with the artifact entry
            XCTAssertTrue(lines[0].hasPrefix("\(key): the model says \(value)"), lines[0])
            XCTAssertFalse(lines[0].contains("\n"))
            values[key] = nil
            XCTAssertTrue(MetadataCheck.mismatches(model: ModelMetadata(values), sidecar: sidecar)[0].hasPrefix("\(key): missing"))
        }
        let named = MetadataCheck.mismatches(model: ModelMetadata(model.userDefinedMetadata), sidecar: sidecar,
                                             inputNames: ["input_1"], outputNames: ["var_123"])
        XCTAssertEqual(named.count, 2)
    }
}
