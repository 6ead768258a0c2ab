// The pipeline's decode path (train/data.py decode_image), ported so that an app feeds the model the same bytes the
// pipeline trained and validated it on: EXIF orientation applied, alpha composited on white, then Pillow's
// ImageOps.fit(image, (S, S), BICUBIC): the shorter side resized to S and the center cropped, in one resample.
//
// Why a port and not vImage/Core Image: iOS resamplers differ from Pillow's (hollance/CoreMLHelpers#14, tf-coreml#234),
// and a different resampler is a different input. The fixtures check this file byte for byte against Pillow.

import Foundation

/// How the bytes of one pixel lie in memory. Alpha is straight (not premultiplied), as PNG stores it and as
/// Pillow composites it; `bgra` is Core Video's 32BGRA, `argb` 32ARGB.
public enum PixelLayout: String, Codable, CaseIterable, Sendable {
    case rgb, rgba, bgra, argb, gray

    public var channels: Int {
        switch self {
        case .rgb: return 3
        case .gray: return 1
        case .rgba, .bgra, .argb: return 4
        }
    }

    /// Byte offsets of R, G, B and alpha (nil: opaque) within a pixel.
    var offsets: (r: Int, g: Int, b: Int, a: Int?) {
        switch self {
        case .rgb: return (0, 1, 2, nil)
        case .gray: return (0, 0, 0, nil)
        case .rgba: return (0, 1, 2, 3)
        case .bgra: return (2, 1, 0, 3)
        case .argb: return (1, 2, 3, 0)
        }
    }
}

/// EXIF orientation 1...8: how the stored pixels must be turned to stand upright.
public enum ExifOrientation: Int, Codable, CaseIterable, Sendable {
    case up = 1, upMirrored, down, downMirrored, leftMirrored, right, rightMirrored, left
}

public enum PixelError: Error, CustomStringConvertible, Equatable {
    case badBuffer(String)

    public var description: String {
        switch self {
        case .badBuffer(let why): return "bad pixel buffer: \(why)"
        }
    }
}

/// 8-bit RGB, row-major, 3 bytes per pixel: what the model's `image` input is filled from.
public struct RGBImage: Equatable, Sendable {
    public let width: Int
    public let height: Int
    public var pixels: [UInt8]

    public init(width: Int, height: Int, pixels: [UInt8]) {
        precondition(pixels.count == width * height * 3, "RGBImage needs width * height * 3 bytes")
        self.width = width
        self.height = height
        self.pixels = pixels
    }
}

/// A decoded image as a platform decoder hands it over (CGImage bytes, a CVPixelBuffer's base address).
public struct PixelBuffer: Sendable {
    public let width: Int
    public let height: Int
    public let layout: PixelLayout
    public let bytesPerRow: Int
    public let bytes: [UInt8]

    public init(width: Int, height: Int, layout: PixelLayout, bytes: [UInt8], bytesPerRow: Int? = nil) throws {
        let row = bytesPerRow ?? width * layout.channels
        guard width > 0, height > 0 else { throw PixelError.badBuffer("size \(width)x\(height)") }
        guard row >= width * layout.channels else {
            throw PixelError.badBuffer("bytesPerRow \(row) < width \(width) x \(layout.channels) channels")
        }
        guard bytes.count >= row * (height - 1) + width * layout.channels else {
            throw PixelError.badBuffer("\(bytes.count) bytes for \(width)x\(height) \(layout.rawValue), rows of \(row)")
        }
        self.width = width
        self.height = height
        self.layout = layout
        self.bytesPerRow = row
        self.bytes = bytes
    }
}

public enum Pixels {
    /// Pillow's Image.alpha_composite(white, image) then convert("RGB"), for one channel value over white:
    /// its integer arithmetic (7 extra bits, rounded divisions by 255), checked against Pillow for all 65,536 pairs.
    @inline(__always)
    static func overWhite(_ c: Int, alpha a: Int) -> UInt8 {
        if a == 0 { return 255 }
        let coef1 = a * 255 * 255 * 128 / (255 * 255)
        let coef2 = 255 * 128 - coef1
        let t = c * coef1 + 255 * coef2 + (0x80 << 7)
        return UInt8((((t >> 8) + t) >> 8) >> 7)
    }

    /// RGB8 from any layout; alpha composited on white, as the pipeline does for RGBA files.
    public static func rgb(from buffer: PixelBuffer) -> RGBImage {
        let (ro, go, bo, ao) = buffer.layout.offsets
        let n = buffer.layout.channels, w = buffer.width
        var out = [UInt8](repeating: 0, count: w * buffer.height * 3)
        // Raw buffers: a 12 MP photo goes through these loops, and checked subscripts made them 5x slower.
        buffer.bytes.withUnsafeBufferPointer { src in
            out.withUnsafeMutableBufferPointer { dst in
                for y in 0..<buffer.height {
                    var p = y * buffer.bytesPerRow, o = y * w * 3
                    for _ in 0..<w {
                        if let ao {
                            let a = Int(src[p + ao])
                            dst[o] = overWhite(Int(src[p + ro]), alpha: a)
                            dst[o + 1] = overWhite(Int(src[p + go]), alpha: a)
                            dst[o + 2] = overWhite(Int(src[p + bo]), alpha: a)
                        } else {
                            dst[o] = src[p + ro]
                            dst[o + 1] = src[p + go]
                            dst[o + 2] = src[p + bo]
                        }
                        p += n
                        o += 3
                    }
                }
            }
        }
        return RGBImage(width: w, height: buffer.height, pixels: out)
    }

    /// The image turned upright, as Pillow's ImageOps.exif_transpose does (5...8 swap width and height).
    public static func upright(_ image: RGBImage, _ orientation: ExifOrientation) -> RGBImage {
        if orientation == .up { return image }
        let w = image.width, h = image.height
        let swaps = orientation.rawValue >= 5
        let ow = swaps ? h : w, oh = swaps ? w : h
        var out = [UInt8](repeating: 0, count: image.pixels.count)
        image.pixels.withUnsafeBufferPointer { src in
            out.withUnsafeMutableBufferPointer { dst in
                for y in 0..<oh {
                    for x in 0..<ow {
                        let (sx, sy): (Int, Int)
                        switch orientation {
                        case .up: (sx, sy) = (x, y)
                        case .upMirrored: (sx, sy) = (w - 1 - x, y)  // FLIP_LEFT_RIGHT
                        case .down: (sx, sy) = (w - 1 - x, h - 1 - y)  // ROTATE_180
                        case .downMirrored: (sx, sy) = (x, h - 1 - y)  // FLIP_TOP_BOTTOM
                        case .leftMirrored: (sx, sy) = (y, x)  // TRANSPOSE
                        case .right: (sx, sy) = (y, h - 1 - x)  // ROTATE_270 (clockwise)
                        case .rightMirrored: (sx, sy) = (w - 1 - y, h - 1 - x)  // TRANSVERSE
                        case .left: (sx, sy) = (w - 1 - y, x)  // ROTATE_90 (counter-clockwise)
                        }
                        let s = (sy * w + sx) * 3, o = (y * ow + x) * 3
                        dst[o] = src[s]
                        dst[o + 1] = src[s + 1]
                        dst[o + 2] = src[s + 2]
                    }
                }
            }
        }
        return RGBImage(width: ow, height: oh, pixels: out)
    }

    /// ImageOps.fit(image, (size, size), BICUBIC) with its defaults (no bleed, centering 0.5): the crop box is
    /// computed in doubles exactly as Python does, then one BICUBIC resample of that box to size x size.
    public static func fit(_ image: RGBImage, size: Int) -> RGBImage {
        let w = Double(image.width), h = Double(image.height)
        let liveRatio = w / h, outputRatio = Double(size) / Double(size)
        let cropW: Double, cropH: Double
        if liveRatio == outputRatio {
            (cropW, cropH) = (w, h)
        } else if liveRatio >= outputRatio {
            (cropW, cropH) = (outputRatio * h, h)
        } else {
            (cropW, cropH) = (w, w / outputRatio)
        }
        let left = (w - cropW) * 0.5, top = (h - cropH) * 0.5
        let box = (left, top, left + cropW, top + cropH)
        if image.width == size && image.height == size && box == (0, 0, w, h) { return image }  // Image.resize's copy
        return Resample.bicubic(image, width: size, height: size,
                                box: (Float(box.0), Float(box.1), Float(box.2), Float(box.3)))
    }

    /// The whole path: a decoder's buffer and its EXIF orientation -> the model's S x S RGB input.
    public static func pipelineCrop(_ buffer: PixelBuffer, orientation: ExifOrientation, size: Int) -> RGBImage {
        fit(upright(rgb(from: buffer), orientation), size: size)
    }
}
