import EmbeddingKit
import XCTest

final class PixelTests: XCTestCase {
    /// 3 x 2 image whose red channel numbers the pixels 0...5 row by row.
    let image = RGBImage(width: 3, height: 2, pixels: (0..<6).flatMap { [UInt8($0), 100, 200] })

    func reds(_ im: RGBImage) -> [[UInt8]] {
        (0..<im.height).map { y in (0..<im.width).map { x in im.pixels[(y * im.width + x) * 3] } }
    }

    func testOrientationsTurnAsExifSays() {
        // 0 1 2 / 3 4 5 stored; what stands upright for each tag
        let want: [ExifOrientation: [[UInt8]]] = [
            .up: [[0, 1, 2], [3, 4, 5]], .upMirrored: [[2, 1, 0], [5, 4, 3]], .down: [[5, 4, 3], [2, 1, 0]],
            .downMirrored: [[3, 4, 5], [0, 1, 2]], .leftMirrored: [[0, 3], [1, 4], [2, 5]], .right: [[3, 0], [4, 1], [5, 2]],
            .rightMirrored: [[5, 2], [4, 1], [3, 0]], .left: [[2, 5], [1, 4], [0, 3]],
        ]
        for o in ExifOrientation.allCases { XCTAssertEqual(reds(Pixels.upright(image, o)), want[o], "\(o)") }
    }

    func testChannelLayoutsAndAlphaOnWhite() throws {
        let px: [UInt8] = [10, 20, 30, 255]
        for (layout, bytes) in [(PixelLayout.rgba, px), (.bgra, [30, 20, 10, 255]), (.argb, [255, 10, 20, 30])] {
            let b = try PixelBuffer(width: 1, height: 1, layout: layout, bytes: bytes)
            XCTAssertEqual(Pixels.rgb(from: b).pixels, [10, 20, 30], "\(layout)")
        }
        let clear = try PixelBuffer(width: 1, height: 1, layout: .rgba, bytes: [10, 20, 30, 0])
        XCTAssertEqual(Pixels.rgb(from: clear).pixels, [255, 255, 255])
        let half = try PixelBuffer(width: 1, height: 1, layout: .rgba, bytes: [0, 0, 0, 128])
        XCTAssertEqual(Pixels.rgb(from: half).pixels, [127, 127, 127])  // Pillow's rounding
        let gray = try PixelBuffer(width: 1, height: 1, layout: .gray, bytes: [77])
        XCTAssertEqual(Pixels.rgb(from: gray).pixels, [77, 77, 77])
        // Padded rows (a CVPixelBuffer's bytesPerRow) are skipped.
        let padded = try PixelBuffer(width: 1, height: 2, layout: .rgb, bytes: [1, 2, 3, 9, 4, 5, 6], bytesPerRow: 4)
        XCTAssertEqual(Pixels.rgb(from: padded).pixels, [1, 2, 3, 4, 5, 6])
    }

    func testBadBuffersAreRefused() {
        XCTAssertThrowsError(try PixelBuffer(width: 2, height: 2, layout: .rgb, bytes: [UInt8](repeating: 0, count: 11)))
        XCTAssertThrowsError(try PixelBuffer(width: 0, height: 2, layout: .rgb, bytes: []))
        XCTAssertThrowsError(try PixelBuffer(width: 2, height: 1, layout: .bgra, bytes: [UInt8](repeating: 0, count: 8), bytesPerRow: 4))
    }

    func testFitOfTheModelSizeIsTheIdentityAndAFlatImageStaysFlat() {
        let sq = RGBImage(width: 4, height: 4, pixels: (0..<48).map { UInt8($0) })
        XCTAssertEqual(Pixels.fit(sq, size: 4), sq)
        let flat = RGBImage(width: 37, height: 23, pixels: [UInt8](repeating: 91, count: 37 * 23 * 3))
        XCTAssertEqual(Pixels.fit(flat, size: 16).pixels, [UInt8](repeating: 91, count: 16 * 16 * 3))
    }
}

final class ClassifierTests: XCTestCase {
    func testMajorityTieGoesToTheLowestClass() {
        let bank: [[Float]] = [[1, 0], [1, 0.01], [0.9, 0.1], [0.9, 0.12]]
        let vote = Classifiers.majority([1, 0], bank: bank, labels: [2, 1, 1, 2], classes: 3, k: 4)
        XCTAssertEqual(vote.scores, [0, 2, 2])
        XCTAssertEqual(vote.label, 1)
    }

    func testKIsCappedAtTheBankSize() {
        let vote = Classifiers.knn([1, 0], bank: [[1, 0], [0, 1]], labels: [0, 1], classes: 2)
        XCTAssertEqual(vote.scores[0], exp(1.0 / 0.1), accuracy: 1e-9)
        XCTAssertEqual(vote.scores[1], exp(0.0), accuracy: 1e-12)
    }

    func testCentroidSaysUnknownBelowItsThreshold() {
        let c = NearestCentroid(bank: [[1, 0], [0, 1]], labels: [0, 1], classes: 3, threshold: 0.9)
        XCTAssertEqual(c.predict([1, 0.1])?.label, 0)
        XCTAssertNil(c.predict([1, 1])!.label)
        XCTAssertEqual(c.predict([1, 1])!.nearest, 0)
    }
}
