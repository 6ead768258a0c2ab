// embedding-demo: see EmbeddingKit/DemoCommand.swift (the logic lives in the library so `swift test` runs it).
import EmbeddingKit
import Foundation

let status = DemoCommand.run(Array(CommandLine.arguments.dropFirst())) { print($0) }
exit(status)
