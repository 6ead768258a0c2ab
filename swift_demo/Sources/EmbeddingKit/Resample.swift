// Pillow's 8-bit BICUBIC resample (libImaging/Resample.c of Pillow 13), reimplemented from its arithmetic: the box
// arrives as float32 (Pillow parses it with "ffff"), filter coefficients are computed in double and normalised per
// output pixel, turned into 22-bit fixed point, then two passes (horizontal then vertical, or the reverse when the
// height shrinks much more than the width), each accumulating in integers from a rounding offset of 2^21 and
// clipping to 0...255.

import Foundation

enum Resample {
    static let precisionBits = 32 - 8 - 2

    /// Keys (a = -0.5) cubic convolution, Pillow's bicubic_filter; support 2.
    @inline(__always)
    static func cubic(_ v: Double) -> Double {
        let a = -0.5
        let x = abs(v)
        if x < 1.0 { return ((a + 2.0) * x - (a + 3.0)) * x * x + 1 }
        if x < 2.0 { return (((x - 5) * x + 8) * x - 4) * a }
        return 0.0
    }

    /// For each output pixel: the first input pixel, how many are used, and their fixed-point weights.
    static func coefficients(inSize: Int, in0: Float, in1: Float, outSize: Int) -> (bounds: [(Int, Int)], weights: [[Int]]) {
        let scale = Double(in1 - in0) / Double(outSize)  // in1 - in0 in float32, as in C
        let filterScale = max(scale, 1.0)
        let support = 2.0 * filterScale
        var bounds: [(Int, Int)] = []
        var weights: [[Int]] = []
        for xx in 0..<outSize {
            let center = Double(in0) + (Double(xx) + 0.5) * scale
            let ss = 1.0 / filterScale
            let xmin = max(Int(center - support + 0.5), 0)  // Int() truncates toward zero, as C's (int)
            let xmax = min(Int(center + support + 0.5), inSize) - xmin
            var k = [Double](repeating: 0, count: max(xmax, 0))
            var ww = 0.0
            for x in 0..<max(xmax, 0) {
                let w = cubic((Double(x + xmin) - center + 0.5) * ss)
                k[x] = w
                ww += w
            }
            let fixed = k.map { v -> Int in
                let n = ww != 0.0 ? v / ww : v
                let s = n * Double(1 << precisionBits)
                return n < 0 ? Int(-0.5 + s) : Int(0.5 + s)
            }
            bounds.append((xmin, max(xmax, 0)))
            weights.append(fixed)
        }
        return (bounds, weights)
    }

    @inline(__always)
    static func clip8(_ v: Int) -> UInt8 {
        let s = v >> precisionBits  // arithmetic shift, as C's on a negative int
        return UInt8(min(max(s, 0), 255))
    }

    typealias Coefficients = (bounds: [(Int, Int)], weights: [[Int]])

    /// One output pixel of either pass: the `n` source pixels from `start`, `step` bytes apart, weighted by `k` in
    /// 22-bit fixed point (rounding half added first, as Pillow's), clipped to 8 bits into `out` at `o`.
    @inline(__always)
    static func convolve(_ src: UnsafeBufferPointer<UInt8>, start: Int, step: Int, _ k: [Int], _ n: Int,
                         into out: UnsafeMutableBufferPointer<UInt8>, at o: Int) {
        let half = 1 << (precisionBits - 1)
        var s0 = half, s1 = half, s2 = half
        k.withUnsafeBufferPointer { k in
            for i in 0..<n {
                let p = start + i * step
                s0 += Int(src[p]) * k[i]
                s1 += Int(src[p + 1]) * k[i]
                s2 += Int(src[p + 2]) * k[i]
            }
        }
        out[o] = clip8(s0)
        out[o + 1] = clip8(s1)
        out[o + 2] = clip8(s2)
    }

    /// One horizontal pass over `rows` rows of `src` starting at row `offset`.
    static func horizontal(_ src: [UInt8], width: Int, offset: Int, rows: Int, _ c: Coefficients) -> [UInt8] {
        let outW = c.bounds.count
        var out = [UInt8](repeating: 0, count: outW * rows * 3)
        src.withUnsafeBufferPointer { src in
            out.withUnsafeMutableBufferPointer { out in
                for y in 0..<rows {
                    for xx in 0..<outW {
                        let (xmin, n) = c.bounds[xx]
                        convolve(src, start: ((y + offset) * width + xmin) * 3, step: 3, c.weights[xx], n, into: out, at: (y * outW + xx) * 3)
                    }
                }
            }
        }
        return out
    }

    /// One vertical pass; bounds index rows of `src` directly.
    static func vertical(_ src: [UInt8], width: Int, _ c: Coefficients) -> [UInt8] {
        let outH = c.bounds.count
        var out = [UInt8](repeating: 0, count: width * outH * 3)
        src.withUnsafeBufferPointer { src in
            out.withUnsafeMutableBufferPointer { out in
                for yy in 0..<outH {
                    let (ymin, n) = c.bounds[yy]
                    for x in 0..<width {
                        convolve(src, start: (ymin * width + x) * 3, step: width * 3, c.weights[yy], n, into: out, at: (yy * width + x) * 3)
                    }
                }
            }
        }
        return out
    }

    static func bicubic(_ image: RGBImage, width: Int, height: Int, box: (Float, Float, Float, Float)) -> RGBImage {
        let needH = width != image.width || box.0 != 0 || Float(width) != box.2
        let needV = height != image.height || box.1 != 0 || Float(height) != box.3
        // Pillow 13 runs the vertical pass first when the height shrinks by more than twice what the width does
        // (Pillow 12 and older always ran horizontal first). The two orders round differently: ±1 on most pixels.
        let horizontalFirst = !(image.height - height > 0 && image.height - height > (image.width - width) * 2)
        let vert = coefficients(inSize: image.height, in0: box.1, in1: box.3, outSize: height)
        let horiz = coefficients(inSize: image.width, in0: box.0, in1: box.2, outSize: width)
        var px = image.pixels, w = image.width, h = image.height
        if horizontalFirst {
            if needH {
                // Only the rows the vertical pass reads, as Pillow does; the vertical bounds shift with them.
                let first = vert.bounds.first!.0, last = vert.bounds.last!.0 + vert.bounds.last!.1
                px = horizontal(px, width: w, offset: first, rows: last - first, horiz)
                (w, h) = (width, last - first)
                if needV {
                    px = vertical(px, width: w, (vert.bounds.map { ($0.0 - first, $0.1) }, vert.weights))
                    h = height
                } else {
                    h = last - first
                }
            } else if needV {
                px = vertical(px, width: w, vert)
                h = height
            }
        } else {
            if needV {
                px = vertical(px, width: w, vert)
                h = height
            }
            if needH {
                px = horizontal(px, width: w, offset: 0, rows: h, horiz)
                w = width
            }
        }
        return RGBImage(width: w, height: h, pixels: px)
    }
}
