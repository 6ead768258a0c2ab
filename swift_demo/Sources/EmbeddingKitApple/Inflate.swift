// Raw DEFLATE for ZipArchive, through Apple's Compression framework (COMPRESSION_ZLIB is RFC 1951 raw deflate).
#if canImport(CoreML) && canImport(Compression)
import Compression
#if canImport(EmbeddingKit)
import EmbeddingKit
#endif
import Foundation

public enum Inflate {
    public static func raw(_ compressed: Data, _ uncompressedSize: Int) throws -> Data {
        if uncompressedSize == 0 { return Data() }
        var out = Data(count: uncompressedSize)
        let written = out.withUnsafeMutableBytes { dst in
            compressed.withUnsafeBytes { src in
                compression_decode_buffer(dst.bindMemory(to: UInt8.self).baseAddress!, uncompressedSize,
                                          src.bindMemory(to: UInt8.self).baseAddress!, compressed.count, nil, COMPRESSION_ZLIB)
            }
        }
        guard written == uncompressedSize else { throw ZipError.corrupt("deflate stream gave \(written) of \(uncompressedSize) bytes") }
        return out
    }
}
#endif
