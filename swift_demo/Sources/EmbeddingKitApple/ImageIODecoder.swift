// A photo file (HEIC, JPEG, PNG...) as EmbeddingKit's PixelBuffer, with its EXIF orientation and a thumbnail, so the
// app feeds the model the pipeline's crop. The bytes are drawn in the image's own colour space (Pillow does not
// colour-manage either: a Display P3 HEIC keeps its values) onto white: CoreGraphics contexts hold premultiplied
// alpha only, so a transparent image is composited by CoreGraphics, which can differ from Pillow's integer
// compositing by ±1; opaque photos are exact.
#if canImport(ImageIO) && canImport(CoreGraphics)
import CoreGraphics
#if canImport(EmbeddingKit)
import EmbeddingKit
#endif
import Foundation
import ImageIO

public struct ImageIODecoder: PhotoDecoder {
    public init() {}

    public func decode(_ data: Data) throws -> DecodedPhoto {
        guard let source = CGImageSourceCreateWithData(data as CFData, nil), let image = CGImageSourceCreateImageAtIndex(source, 0, nil) else {
            throw PixelError.badBuffer("not an image ImageIO can read")
        }
        let props = CGImageSourceCopyPropertiesAtIndex(source, 0, nil) as? [CFString: Any]
        let raw = (props?[kCGImagePropertyOrientation] as? NSNumber)?.intValue ?? 1
        let options = [kCGImageSourceCreateThumbnailFromImageAlways: true, kCGImageSourceThumbnailMaxPixelSize: 160,
                       kCGImageSourceCreateThumbnailWithTransform: true] as CFDictionary
        let thumbnail = CGImageSourceCreateThumbnailAtIndex(source, 0, options).flatMap(Self.jpeg)
        return DecodedPhoto(pixels: try Self.buffer(image), orientation: ExifOrientation(rawValue: raw) ?? .up, thumbnail: thumbnail)
    }

    static func buffer(_ image: CGImage) throws -> PixelBuffer {
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

    static func jpeg(_ image: CGImage) -> Data? {
        let out = NSMutableData()
        guard let destination = CGImageDestinationCreateWithData(out as CFMutableData, "public.jpeg" as CFString, 1, nil) else { return nil }
        CGImageDestinationAddImage(destination, image, [kCGImageDestinationLossyCompressionQuality: 0.8] as CFDictionary)
        return CGImageDestinationFinalize(destination) ? out as Data : nil
    }
}
#endif
