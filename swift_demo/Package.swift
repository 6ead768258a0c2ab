// swift-tools-version:5.9
// EmbeddingKit: the pure-Swift core (Foundation only; built and tested on Linux and macOS).
// EmbeddingKitApple: Core ML / Vision / camera, every file under `#if canImport(CoreML)`, so on Linux it compiles
// to an empty module. The iPad app is a separate app package, EmbeddingDemoApp.swiftpm, depending on this one:
// Linux never parses its manifest (it imports AppleProductTypes). No dependencies: SwiftPM fetches nothing.
import PackageDescription

let package = Package(
    name: "EmbeddingDemo",
    platforms: [.macOS(.v13), .iOS(.v16)],
    products: [
        .library(name: "EmbeddingKit", targets: ["EmbeddingKit"]),
        .library(name: "EmbeddingKitApple", targets: ["EmbeddingKitApple"]),
        .executable(name: "embedding-demo", targets: ["embedding-demo"]),
    ],
    targets: [
        .target(name: "EmbeddingKit"),
        .target(name: "EmbeddingKitApple", dependencies: ["EmbeddingKit"]),
        .executableTarget(name: "embedding-demo", dependencies: ["EmbeddingKit"]),
        // Fixtures are read through #filePath, not as bundle resources: `swift test` reads them in place.
        .testTarget(name: "EmbeddingKitTests", dependencies: ["EmbeddingKit"], exclude: ["Fixtures", "Fixtures-resnet18", "FixturesPalettized", "ZipSamples"]),
        .testTarget(name: "EmbeddingKitAppleTests", dependencies: ["EmbeddingKitApple", "EmbeddingKit"]),
    ]
)
