import EmbeddingKit
import XCTest

final class CameraTests: XCTestCase {
    func testEachHoldTurnsFramesAndPreviewAlike() {
        // UIDeviceOrientation raw values: portrait 1, upside down 2, landscapeLeft 3, landscapeRight 4.
        XCTAssertEqual(BackCamera.frameOrientation(deviceOrientation: 1), .right)
        XCTAssertEqual(BackCamera.frameOrientation(deviceOrientation: 2), .left)
        XCTAssertEqual(BackCamera.frameOrientation(deviceOrientation: 3), .up)
        XCTAssertEqual(BackCamera.frameOrientation(deviceOrientation: 4), .down)
        for flatOrUnknown in [0, 5, 6, 99] {
            XCTAssertNil(BackCamera.frameOrientation(deviceOrientation: flatOrUnknown))
            XCTAssertNil(BackCamera.previewRotationAngle(deviceOrientation: flatOrUnknown))
        }
        // The preview angle is the frame's turn: a 2 x 1 sensor frame turned by the EXIF tag stands as the angle says.
        let sensor = RGBImage(width: 2, height: 1, pixels: [1, 0, 0, 2, 0, 0])
        for hold in BackCamera.Hold.allCases {
            let turned = Pixels.upright(sensor, BackCamera.frameOrientation(deviceOrientation: hold.rawValue)!)
            let angle = BackCamera.previewRotationAngle(deviceOrientation: hold.rawValue)!
            let reds = stride(from: 0, to: turned.pixels.count, by: 3).map { turned.pixels[$0] }
            let clockwise: [Double: [UInt8]] = [0: [1, 2], 90: [1, 2], 180: [2, 1], 270: [2, 1]]  // read row by row
            XCTAssertEqual(reds, clockwise[angle], "\(hold)")
            XCTAssertEqual(turned.width, angle == 90 || angle == 270 ? 1 : 2, "\(hold)")
        }
    }

    func testOnlyADeniedCameraOffersSettings() {
        XCTAssertNil(CameraAccess.notDetermined.blockedMessage)
        XCTAssertNil(CameraAccess.authorized.blockedMessage)
        XCTAssertTrue(CameraAccess.denied.settingsCanHelp)
        XCTAssertFalse(CameraAccess.restricted.settingsCanHelp)
        XCTAssertNotNil(CameraAccess.restricted.blockedMessage)
    }
}

final class ComputePlanTests: XCTestCase {
    func testFallbacksEndOnTheCPU() {
        XCTAssertEqual(ComputeChoice.all.fallbacks, [.all, .cpuAndNeuralEngine, .cpuAndGPU, .cpuOnly])
        XCTAssertEqual(ComputeChoice.cpuAndGPU.fallbacks, [.cpuAndGPU, .cpuOnly])
        XCTAssertEqual(ComputeChoice.cpuOnly.fallbacks, [.cpuOnly])
    }

    func testPlacementsAreCountedPerUnitWithTheirCost() {
        let ops = [OpPlacement(op: "const", preferred: nil), OpPlacement(op: "const", preferred: nil)]
            + (0..<6).map { _ in OpPlacement(op: "conv", preferred: .neuralEngine, supported: [.neuralEngine, .gpu, .cpu], cost: 0.15) }
            + [OpPlacement(op: "relu", preferred: .neuralEngine, supported: [.neuralEngine, .cpu], cost: 0.02),
               OpPlacement(op: "reduce_l2_norm", preferred: .cpu, supported: [.cpu], cost: 0.04),
               OpPlacement(op: "real_div", preferred: .cpu, supported: [.neuralEngine, .cpu], cost: 0.02),
               OpPlacement(op: "reduce_l2_norm", preferred: .gpu, supported: [.gpu, .cpu], cost: 0.02)]
        let s = ComputePlanSummary(ops)
        XCTAssertEqual(s.dispatched, 10)
        XCTAssertEqual(s.notDispatched, 2)
        XCTAssertEqual(s.share(.neuralEngine).ops, 7)
        XCTAssertEqual(s.share(.neuralEngine).fractionOfOps, 0.7, accuracy: 1e-12)
        XCTAssertEqual(s.share(.neuralEngine).fractionOfCost!, 0.92 / 1.0, accuracy: 1e-12)
        XCTAssertEqual(s.share(.cpu).ops, 2)
        XCTAssertEqual(s.share(.gpu).fractionOfCost!, 0.02, accuracy: 1e-12)
        XCTAssertEqual(s.offNeuralEngine.map { "\($0.op) \($0.count) \($0.neuralEngineSupported)" }, ["reduce_l2_norm 2 false", "real_div 1 true"])
        XCTAssertEqual(s.lines, ["operations planned: 10 — Neural Engine 7 (70 %, 92 % of the cost), GPU 1 (10 %, 2 % of the cost), CPU 2 (20 %, 6 % of the cost); 2 constants not dispatched",
                                 "off the Neural Engine: reduce_l2_norm ×2, real_div ×1 (it could run there)"])
    }

    func testAPlanWithoutCostsOrOperationsSaysSo() {
        let cpu = ComputePlanSummary([OpPlacement(op: "inner_product", preferred: .cpu)])
        XCTAssertNil(cpu.share(.cpu).fractionOfCost)
        XCTAssertEqual(cpu.lines[0], "operations planned: 1 — Neural Engine 0 (0 %), GPU 0 (0 %), CPU 1 (100 %)")
        XCTAssertEqual(ComputePlanSummary([]).share(.neuralEngine).fractionOfOps, 0)
    }
}
