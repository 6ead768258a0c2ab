// A photo (library or camera still) as EmbeddingKit's PixelBuffer, so the app feeds the model the pipeline's crop.
// The bytes are drawn in the image's own colour space (Pillow does not colour-manage either: a Display P3 HEIC keeps
// its values) onto white: CoreGraphics contexts hold premultiplied alpha only, so a transparent image is composited
// by CoreGraphics, which can differ from Pillow's integer compositing by ±1; opaque photos are exact.
#if canImport(CoreML) && canImport(CoreGraphics)
import CoreGraphics
import EmbeddingKit
import Foundation

public enum PhotoPixels {
    public static func buffer(_ image: CGImage) throws -> PixelBuffer {
        let w = image.width, h = image.height
        let space = image.colorSpace.flatMap { $0.model == .rgb ? $0 : nil } ?? CGColorSpace(name: CGColorSpace.sRGB)!
        var bytes = [UInt8](repeating: 255, count: w * h * 4)
        let drawn: Bool = bytes.withUnsafeMutableBytes { raw in
            guard let ctx = CGContext(data: raw.baseAddress, width: w, height: h, bitsPerComponent: 8, bytesPerRow: w * 4,
                                      space: space, bitmapInfo: CGImageAlphaInfo.premultipliedLast.rawValue) else { return false }
            ctx.setFillColor(CGColor(colorSpace: space, components: [1, 1, 1, 1])!)
            ctx.fill(CGRect(x: 0, y: 0, width: w, height: h))
            ctx.interpolationQuality = .none
            ctx.draw(image, in: CGRect(x: 0, y: 0, width: w, height: h))
            return true
        }
        guard drawn else { throw PixelError.badBuffer("cannot draw a \(w)x\(h) image") }
        return try PixelBuffer(width: w, height: h, layout: .rgba, bytes: bytes)
    }

    /// The model's input for a photo: EXIF orientation as the photo library reports it, then the pipeline's crop.
    public static func crop(_ image: CGImage, orientation: ExifOrientation, size: Int) throws -> RGBImage {
        Pixels.pipelineCrop(try buffer(image), orientation: orientation, size: size)
    }
}
#endif
