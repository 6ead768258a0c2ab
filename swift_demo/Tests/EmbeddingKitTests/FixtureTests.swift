// The port against the pipeline: every value here was computed by the pipeline's own code (`pipeline
// swift-fixtures`, stages/swift_fixtures.py) and committed in Fixtures/; tests/stages/test_swift_fixtures.py
// keeps them current with the Python side. Two sets, each checked by every test: Fixtures/ is of `make all`'s
// default model (MobileNetV3-Small on photos; what `make swift-fixtures` writes and the app bundles as Golden/),
// Fixtures-resnet18/ of a ResNet-18 on digits, so the port is held to two backbones' outputs, class counts and sizes.

import EmbeddingKit
import Foundation
import XCTest

let fixtureFolders = ["Fixtures", "Fixtures-resnet18"].map {
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent($0)
}
let fixturesFolder = fixtureFolders[0]  // the default model's: the app's Golden/

final class FixtureTests: XCTestCase {
    static let sets: [FixtureSet] = fixtureFolders.map { try! FixtureSet(folder: $0) }
    static var set: FixtureSet { sets[0] }

    func testTheSetsAreTheDefaultMobileNetAndAResNet() throws {
        let backbones = try fixtureFolders.map { try EncoderSidecar.parse(Data(contentsOf: $0.appendingPathComponent("encoder.json"))).backbone }
        XCTAssertTrue(backbones[0].hasPrefix("mobilenet_v3"), "Fixtures/ is of make all's default model, not \(backbones[0])")
        XCTAssertEqual(backbones[1], "resnet18")
    }

    func testFixturesCoverEveryOrientationLayoutAndAlpha() {
        for set in Self.sets {
            let q = set.manifest.queries
            XCTAssertEqual(Set(q.map(\.orientation)), Set(1...8))
            XCTAssertEqual(Set(q.map(\.layout)), Set(PixelLayout.allCases))
            XCTAssertTrue(q.contains { $0.alpha != nil })
            XCTAssertTrue(q.contains { min($0.width, $0.height) < set.manifest.imageSize }, "an upscaled image")
            XCTAssertTrue(q.contains { $0.width == set.manifest.imageSize && $0.height == set.manifest.imageSize }, "the identity size")
        }
    }

    func testCropsAreByteIdenticalToThePipelines() throws {
        for set in Self.sets {
            for (i, q) in set.manifest.queries.enumerated() {
                let (buffer, orientation) = try set.buffer(i)
                let crop = Pixels.pipelineCrop(buffer, orientation: orientation, size: set.manifest.imageSize)
                XCTAssertEqual(crop, set.expectedCrop(i), "query \(i): \(q.width)x\(q.height) \(q.layout) orientation \(q.orientation) alpha \(q.alpha ?? "none")")
            }
        }
    }

    func testACameraFrameBufferCropsByteForByteAsItsRGBBytes() throws {
        for set in Self.sets {
            for (i, q) in set.manifest.queries.enumerated() {
                let (buffer, orientation) = try set.buffer(i)
                let rgb = Pixels.rgb(from: buffer)
                let fromRGB = Pixels.pipelineCrop(try PixelBuffer(width: rgb.width, height: rgb.height, layout: .rgb, bytes: rgb.pixels),
                                                  orientation: orientation, size: set.manifest.imageSize)
                XCTAssertEqual(fromRGB, set.expectedCrop(i), "query \(i)")
                for layout in [PixelLayout.bgra, .rgba] {
                    for padding in [0, 4, 60] {  // CVPixelBuffer rows are padded to an alignment
                        let frame = framePixels(rgb, layout: layout, padding: padding)
                        XCTAssertEqual(Pixels.pipelineCrop(frame, orientation: orientation, size: set.manifest.imageSize), fromRGB,
                                       "query \(i) \(q.width)x\(q.height) as \(layout) padded by \(padding)")
                    }
                }
            }
        }
    }

    func testWeightedKNNMatchesStagesKnn() {
        for set in Self.sets {
            let e = set.manifest.expected
            XCTAssertEqual(e.weightedK, Classifiers.weightedK)
            XCTAssertEqual(e.temperature, Classifiers.temperature)
            XCTAssertLessThan(set.bankEmbeddings.count, e.weightedK, "the fixtures exercise the cap of k at the bank size")
            for (i, q) in set.queryEmbeddings.enumerated() {
                let vote = Classifiers.knn(q, bank: set.bankEmbeddings, labels: set.bankLabels, classes: set.manifest.classes.count)
                XCTAssertEqual(vote.label, e.queries[i].knnLabel, "query \(i)")
                for (got, want) in zip(vote.scores, e.queries[i].knnScores) {
                    XCTAssertEqual(got, want, accuracy: 1e-5 * abs(want), "query \(i)")
                }
            }
        }
    }

    func testMajorityAndCentroidMatchThePipeline() {
        for set in Self.sets {
            let e = set.manifest.expected
            XCTAssertEqual(e.majorityK, Classifiers.majorityK)
            let centroid = NearestCentroid(bank: set.bankEmbeddings, labels: set.bankLabels, classes: set.manifest.classes.count,
                                           threshold: e.centroidThreshold)
            var unknown = 0
            for (i, q) in set.queryEmbeddings.enumerated() {
                let maj = Classifiers.majority(q, bank: set.bankEmbeddings, labels: set.bankLabels, classes: set.manifest.classes.count)
                XCTAssertEqual(maj.label, e.queries[i].majorityLabel, "query \(i)")
                XCTAssertEqual(maj.scores.map { Int($0) }, e.queries[i].majorityVotes, "query \(i)")
                let c = centroid.predict(q)!
                XCTAssertEqual(c.label, e.queries[i].centroidLabel, "query \(i)")
                XCTAssertEqual(c.nearest, e.queries[i].centroidNearest, "query \(i)")
                XCTAssertEqual(c.cosine, e.queries[i].centroidCosine, accuracy: 1e-5, "query \(i)")
                unknown += c.label == nil ? 1 : 0
            }
            XCTAssertGreaterThan(unknown, 0, "some queries fall below the threshold: the unknown branch is exercised")
        }
    }

    func testIndexSearchReturnsThePipelinesTopFive() throws {
        for set in Self.sets {
            let index = try set.bankIndex()
            for (i, q) in set.queryEmbeddings.enumerated() {
                let want = set.manifest.expected.queries[i]
                let hits = try index.search(q, top: want.topIds.count)
                XCTAssertEqual(hits.map(\.record.id), want.topIds.map { "bank-\($0)" }, "query \(i)")
                for (hit, sim) in zip(hits, want.topSimilarities) { XCTAssertEqual(hit.similarity, sim, accuracy: 1e-5) }
            }
        }
    }

    func testAPreparedBankAnswersExactlyAsTheClassifiers() throws {
        for set in Self.sets {
            let index = try set.bankIndex()
            let bank = LabelledBank(index)
            XCTAssertEqual(bank.classes, Array(Set(set.manifest.bank.map { set.manifest.classes[$0.label] })).sorted())
            let threshold = set.manifest.expected.centroidThreshold
            let centroid = NearestCentroid(bank: index.records.map(\.vector), labels: bank.labels, classes: bank.classes.count, threshold: threshold)
            for q in set.queryEmbeddings {
                let a = bank.answer(q, top: 5, threshold: threshold)
                XCTAssertEqual(a.knn, Classifiers.knn(q, bank: index.records.map(\.vector), labels: bank.labels, classes: bank.classes.count))
                XCTAssertEqual(a.centroid, centroid.predict(q))
                XCTAssertEqual(a.nearest.map { bank.ids[$0.index] }, try index.search(q, top: 5).map(\.record.id))
                XCTAssertEqual(a.nearest.map(\.similarity), try index.search(q, top: 5).map(\.similarity))
            }
        }
    }

    func testParityMetricsAndGatesMatchValidate() throws {
        for set in Self.sets {
            XCTAssertFalse(set.manifest.parity.variants.isEmpty)
            for (name, want) in set.manifest.parity.variants {
                let got = try XCTUnwrap(Parity.compare(reference: set.queryEmbeddings, output: set.parityVariant(name), topK: set.manifest.parity.topK))
                XCTAssertEqual(got.worstCosine, want.worstCosine, accuracy: 1e-9, name)
                XCTAssertEqual(got.worstRelL2, want.worstRelL2, accuracy: 1e-6 * want.worstRelL2 + 1e-12, name)
                XCTAssertEqual(got.maxAbs, want.maxAbs, accuracy: 1e-9, name)
                XCTAssertEqual(got.topKAgreement ?? -1, want.topkAgreement ?? -1, accuracy: 1e-12, name)
                for p in Precision.allCases {
                    XCTAssertEqual(!Parity.failures(got, precision: p).isEmpty, want.fails(p), "\(name), \(p) gates")
                }
            }
            // fp16 rounding passes the fp16 and compressed gates; 3% noise fails fp16's and passes a compressed
            // model's (its weights move every embedding that much); one image turned around fails every gate.
            let v = set.manifest.parity.variants
            XCTAssertEqual(Precision.allCases.map { v["fp16"]?.fails($0) }, [false, false, false])
            XCTAssertEqual(Precision.allCases.map { v["noisy"]?.fails($0) }, [true, true, false])
            XCTAssertEqual(Precision.allCases.map { v["flipped"]?.fails($0) }, [true, true, true])
        }
    }

    func testTheAppsGatesAreValidatesDefaults() {
        let g = ParityGates()
        for set in Self.sets {
            let want = set.manifest.parity.gates
            XCTAssertEqual([g.fp32MaxAbs, g.fp32MinCosine, g.fp16MaxRelL2, g.fp16MinTopK, g.compressedMinTopK, g.compressedMinCosine],
                           [want.fp32MaxAbs, want.fp32MinCosine, want.fp16MaxRelL2, want.fp16MinTopk, want.compressedMinTopk, want.compressedMinCosine],
                           "export/configs.py's ValidateConfig changed a bound: change ParityGates to match")
            XCTAssertEqual(g.topK, set.manifest.parity.topK)
        }
    }

    func testACompressedModelIsHeldToTheCompressedGatesWhereverItRuns() {
        let fp32 = ModelMetadata(["precision": "fp32"]), fp16 = ModelMetadata(["precision": "fp16", "compression": "fp16"])
        let int8 = ModelMetadata(["precision": "fp16", "compression": "int8"])
        XCTAssertEqual(Precision.of(fp32, cpuOnly: true), .fp32)
        XCTAssertEqual(Precision.of(fp32, cpuOnly: false), .fp16)  // the GPU and Neural Engine compute in fp16
        XCTAssertEqual(Precision.of(fp16, cpuOnly: true), .fp16)
        XCTAssertEqual(Precision.of(ModelMetadata([:]), cpuOnly: true), .fp16)  // neither said: fp16's gates
        XCTAssertEqual(Precision.of(int8, cpuOnly: true), .compressed)
        XCTAssertEqual(Precision.of(ModelMetadata(["precision": "fp16", "compression": "palettize-6"]), cpuOnly: false), .compressed)
    }

    func testGoldenEmbeddingsPassTheirOwnGates() throws {
        for set in Self.sets {
            let m = try XCTUnwrap(Parity.compare(reference: set.queryEmbeddings, output: set.queryEmbeddings))
            XCTAssertEqual(Parity.failures(m, precision: .fp32), [])
        }
    }
}

final class DemoCommandTests: XCTestCase {
    func testCheckReproducesThePipelinesPredictions() {
        for folder in fixtureFolders {
            var lines: [String] = []
            XCTAssertEqual(DemoCommand.run(["check", folder.path]) { lines.append($0) }, 0, lines.joined(separator: "\n"))
            XCTAssertTrue(lines.last?.hasPrefix("ok:") == true, folder.lastPathComponent)
        }
    }

    func testIndexSearchAndClassifyOnTheFixtures() throws {
        for (fixturesFolder, set) in zip(fixtureFolders, FixtureTests.sets) {
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ekdemo-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: dir) }
            let index = dir.appendingPathComponent("bank.ekix").path
            var out: [String] = []
            XCTAssertEqual(DemoCommand.run(["index", fixturesFolder.path, index]) { out.append($0) }, 0, out.joined())
            out = []
            XCTAssertEqual(DemoCommand.run(["search", index, fixturesFolder.path, "3", "--top", "5"]) { out.append($0) }, 0)
            XCTAssertEqual(out.count, 6)
            XCTAssertTrue(out[1].contains("bank-\(set.manifest.expected.queries[3].topIds[0]) "), out[1])
            out = []
            XCTAssertEqual(DemoCommand.run(["classify", index, fixturesFolder.path]) { out.append($0) }, 0)
            XCTAssertEqual(out.count, set.queryEmbeddings.count + 1)
            for (i, line) in out.dropFirst().enumerated() {
                let cols = line.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
                let want = set.manifest.expected.queries[i]
                XCTAssertEqual(cols[2], set.manifest.classes[want.knnLabel], "query \(i) kNN")
                XCTAssertEqual(cols[3], set.manifest.classes[want.majorityLabel], "query \(i) majority")
                XCTAssertEqual(cols[4], want.centroidLabel.map { set.manifest.classes[$0] } ?? "unknown", "query \(i) centroid")
            }
        }
    }

    func testBenchMeasuresEachStep() {
        var out: [String] = []
        XCTAssertEqual(DemoCommand.run(["bench", "40", "8", "64"]) { out.append($0) }, 0, out.joined(separator: "\n"))
        XCTAssertEqual(out.count, 8)
        XCTAssertTrue(out.allSatisfy { $0.hasSuffix(" ms CPU") }, out.joined(separator: "\n"))
        XCTAssertEqual(DemoCommand.run(["bench", "0"]) { out.append($0) }, 2)
    }

    func testBadInputIsOneErrorLineAndStatus2() {
        var out: [String] = []
        XCTAssertEqual(DemoCommand.run(["check", "/nonexistent"]) { out.append($0) }, 2)
        XCTAssertTrue(out.count == 1 && out[0].hasPrefix("error: "), "\(out)")
        out = []
        XCTAssertEqual(DemoCommand.run(["frobnicate"]) { out.append($0) }, 2)
        XCTAssertTrue(out[0].hasPrefix("usage:"))
    }
}
