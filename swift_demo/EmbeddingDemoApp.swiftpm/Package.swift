// swift-tools-version: 5.9
// The iPad app: an app package (open this folder in Xcode 15+ or Swift Playgrounds 4.4+; no .xcodeproj). It depends
// on the package one folder up (EmbeddingKit, EmbeddingKitApple). Linux never reads this manifest: `swift test` in
// swift_demo/ builds that package only. App/Golden links to the fixtures `pipeline swift-fixtures` writes, so the
// self-test's golden crops are always those of the model the fixtures were made for.
import PackageDescription

#if canImport(AppleProductTypes)
import AppleProductTypes

let package = Package(
    name: "EmbeddingDemoApp",
    platforms: [.iOS("17.0")],
    products: [
        .iOSApplication(
            name: "Embedding Demo",
            targets: ["AppModule"],
            bundleIdentifier: "org.sslEdgePipeline.EmbeddingDemo",
            teamIdentifier: "",  // set yours in Xcode's Signing & Capabilities to run on an iPad
            displayVersion: "1.0",
            bundleVersion: "1",
            supportedDeviceFamilies: [.pad, .phone],
            supportedInterfaceOrientations: [.portrait, .landscapeRight, .landscapeLeft, .portraitUpsideDown(.when(deviceFamilies: [.pad]))],
            capabilities: [.camera(purposeString: "Live classification of what the camera sees, with your model.")]
        ),
    ],
    dependencies: [.package(path: "..")],
    targets: [
        .executableTarget(
            name: "AppModule",
            dependencies: [.product(name: "EmbeddingKit", package: "swift_demo"), .product(name: "EmbeddingKitApple", package: "swift_demo")],
            path: "App",
            resources: [.copy("Golden")]
        ),
    ]
)
#else
// Without Apple's product types (Linux, SwiftPM outside Xcode) there is no app to declare; the manifest still parses.
let package = Package(name: "EmbeddingDemoApp")
#endif
