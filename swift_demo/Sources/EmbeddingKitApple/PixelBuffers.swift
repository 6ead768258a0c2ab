// EmbeddingKit's pixels to and from Core Video: the model's RGB crop into the 32BGRA buffer Core ML reads, and a
// camera frame's 32BGRA buffer copied out (rows with their padding) so that the frame goes through the same crop as
// a photo, and the capture pool gets its buffer back at once.
#if canImport(CoreVideo)
import CoreVideo
#if canImport(EmbeddingKit)
import EmbeddingKit
#endif
import Foundation

public enum PixelBuffers {
    /// 32BGRA, opaque.
    public static func bgra(_ image: RGBImage) throws -> CVPixelBuffer {
        var buffer: CVPixelBuffer?
        let attrs = [kCVPixelBufferIOSurfacePropertiesKey as String: [String: Any]()] as CFDictionary  // IOSurface-backed
        let status = CVPixelBufferCreate(kCFAllocatorDefault, image.width, image.height, kCVPixelFormatType_32BGRA, attrs, &buffer)
        guard status == kCVReturnSuccess, let buffer else { throw PixelError.badBuffer("CVPixelBufferCreate failed (\(status))") }
        CVPixelBufferLockBaseAddress(buffer, [])
        defer { CVPixelBufferUnlockBaseAddress(buffer, []) }
        let row = CVPixelBufferGetBytesPerRow(buffer)
        let base = CVPixelBufferGetBaseAddress(buffer)!.assumingMemoryBound(to: UInt8.self)
        for y in 0..<image.height {
            for x in 0..<image.width {
                let s = (y * image.width + x) * 3, d = y * row + x * 4
                base[d] = image.pixels[s + 2]
                base[d + 1] = image.pixels[s + 1]
                base[d + 2] = image.pixels[s]
                base[d + 3] = 255
            }
        }
        return buffer
    }

    /// A 32BGRA buffer (a camera frame) as EmbeddingKit's PixelBuffer.
    public static func pixels(of buffer: CVPixelBuffer) throws -> PixelBuffer {
        CVPixelBufferLockBaseAddress(buffer, .readOnly)
        defer { CVPixelBufferUnlockBaseAddress(buffer, .readOnly) }
        let w = CVPixelBufferGetWidth(buffer), h = CVPixelBufferGetHeight(buffer), row = CVPixelBufferGetBytesPerRow(buffer)
        guard CVPixelBufferGetPixelFormatType(buffer) == kCVPixelFormatType_32BGRA, let base = CVPixelBufferGetBaseAddress(buffer) else {
            throw PixelError.badBuffer("expected a 32BGRA pixel buffer")
        }
        let bytes = [UInt8](UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self), count: row * h))
        return try PixelBuffer(width: w, height: h, layout: .bgra, bytes: bytes, bytesPerRow: row)
    }
}
#endif
