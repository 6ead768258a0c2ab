// What the pipeline says about a model, from its two sources (export/metadata.py writes both from one dict):
// - the sidecar RUN/export/encoder.json (typed JSON, lists every artifact with its sha256);
// - the model's own `user_defined_metadata` (string -> string: lists and booleans JSON-encoded, numbers as Python
//   prints them), which travels inside the .mlmodel / .mlpackage the user imports.
// The app shows the model's card from the second and checks it against the first; every mismatch is one line.

import Foundation

public struct EncoderSidecar: Decodable, Sendable {
    public struct Artifact: Decodable, Sendable {
        public let format: String
        public let file: String
        public let precision: String
        public let sha256: String
        public let encoderSha256: String?
        public let sizeBytes: Int?
        /// The weight compression of `pipeline export --compress` (fp16: none); absent in older sidecars.
        public let compression: String?
    }

    public let method: String
    public let backbone: String
    public let embeddingDim: Int
    public let imageSize: Int
    public let mean: [Double]
    public let std: [Double]
    public let l2Normalized: Bool
    public let inputName: String
    public let outputName: String
    public let visionCropAndScale: String
    public let encoderSha256: String
    public let runId: String?
    public let linearTop1: Double?
    public let knnTop1: Double?
    public let artifacts: [Artifact]

    public static func parse(_ data: Data) throws -> EncoderSidecar {
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return try decoder.decode(EncoderSidecar.self, from: data)
    }
}

/// A model's user_defined_metadata, with the typed reads the app needs.
public struct ModelMetadata: Sendable {
    public let values: [String: String]

    public init(_ values: [String: String]) { self.values = values }

    /// The `compression` of a model without compressed weights (export/compression.py's NONE); older models say none.
    public static let uncompressed = "fp16"
    /// The weight compression of `pipeline export --compress`.
    public var compression: String { values["compression"] ?? Self.uncompressed }

    public subscript(key: String) -> String? { values[key] }
    public func int(_ key: String) -> Int? { values[key].flatMap { Int($0) } }
    public func double(_ key: String) -> Double? { values[key].flatMap { Double($0) } }
    public func bool(_ key: String) -> Bool? { values[key].flatMap { ["true": true, "false": false][$0] } }

    /// The card the app shows after an import.
    public var card: [(String, String)] {
        let pct = { (v: Double?) in v.map { String(format: "%.1f %%", 100 * $0) } ?? "not measured" }
        return [("method", values["method"] ?? "?"), ("backbone", values["backbone"] ?? "?"),
                ("embedding", "\(values["embedding_dim"] ?? "?")-d\(bool("l2_normalized") == true ? ", L2-normalised" : "")"),
                ("input", "\(values["image_size"] ?? "?") px, \(values["vision_crop_and_scale"] ?? "?")"),
                ("precision", values["precision"] ?? "?"), ("weights", compression),
                ("linear top-1", pct(double("linear_top1"))),
                ("kNN top-1", pct(double("knn_top1"))), ("run", values["run_id"] ?? "?")]
    }
}

public enum MetadataCheck {
    /// One line per disagreement between the imported model and encoder.json (and the model's real input/output
    /// names when the caller read them from the model description). Empty: the model is the one the sidecar describes.
    public static func mismatches(model: ModelMetadata, sidecar: EncoderSidecar,
                                  inputNames: [String]? = nil, outputNames: [String]? = nil) -> [String] {
        var out: [String] = []
        func check(_ key: String, _ model: String?, _ sidecar: String) {
            guard let model else { out.append("\(key): missing from the model's metadata (encoder.json says \(sidecar))"); return }
            if model != sidecar { out.append("\(key): the model says \(model), encoder.json says \(sidecar)") }
        }
        check("embedding_dim", model.int("embedding_dim").map(String.init), String(sidecar.embeddingDim))
        check("image_size", model.int("image_size").map(String.init), String(sidecar.imageSize))
        check("encoder_sha256", model["encoder_sha256"], sidecar.encoderSha256)
        check("l2_normalized", model.bool("l2_normalized").map { String($0) }, String(sidecar.l2Normalized))
        check("vision_crop_and_scale", model["vision_crop_and_scale"], sidecar.visionCropAndScale)
        check("input_name", model["input_name"], sidecar.inputName)
        check("output_name", model["output_name"], sidecar.outputName)
        if let inputNames, !inputNames.contains(sidecar.inputName) {
            out.append("input: the model's inputs are \(inputNames), encoder.json names \(sidecar.inputName)")
        }
        if let outputNames, !outputNames.contains(sidecar.outputName) {
            out.append("output: the model's outputs are \(outputNames), encoder.json names \(sidecar.outputName)")
        }
        // Several compressions of one format sit side by side: the model's own compression picks its entry.
        let compression = model.compression
        if let format = model["format"], let sha = model["encoder_sha256"],
           let entry = sidecar.artifacts.first(where: { $0.format == format && ($0.compression ?? ModelMetadata.uncompressed) == compression }),
           let made = entry.encoderSha256, made != sha {
            out.append("artifact: encoder.json lists the \(format) (\(compression)) as made from encoder \(made.prefix(12)), the model says \(sha.prefix(12))")
        }
        return out
    }
}
