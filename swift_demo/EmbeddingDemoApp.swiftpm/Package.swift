// swift-tools-version: 5.9
// The iPad app as an app package (a .swiftpm folder): Xcode 15+ opens it (File > Open), and so does Swift
// Playgrounds 4.4+ on an iPad or a Mac. Playgrounds builds an app package only from its own folder: it takes remote
// package dependencies, not `.package(path:)`, and symlinks do not survive the copy onto an iPad (a symlinked
// resource also dangles in the built bundle). So the folder holds everything, as plain files, in one target:
//   App/               the app's screens (SwiftUI)
//   EmbeddingKit/      copies of ../Sources/EmbeddingKit and ../Sources/EmbeddingKitApple: edit those, then
//   EmbeddingKitApple/ run ../sync_app.sh; `swift test` in swift_demo/ fails while a copy differs
//   Golden/            a copy of ../Tests/EmbeddingKitTests/Fixtures (the self-test's golden crops), bundled whole
// The usage strings (NSCameraUsageDescription, NSPhotoLibraryUsageDescription) are the capabilities below.
// Linux never needs this manifest; without Apple's product types it declares no app, so it still parses there.
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
            teamIdentifier: "",  // set yours in Signing & Capabilities to run on an iPad
            displayVersion: "1.0",
            bundleVersion: "1",
            supportedDeviceFamilies: [.pad, .phone],
            supportedInterfaceOrientations: [.portrait, .landscapeRight, .landscapeLeft, .portraitUpsideDown(.when(deviceFamilies: [.pad]))],
            capabilities: [
                .camera(purposeString: "The Live screen classifies what the camera sees with your model, on this device."),
                .photoLibrary(purposeString: "Photos you pick are labelled, embedded and stored on this device to classify against."),
            ]
        ),
    ],
    targets: [
        .executableTarget(
            name: "AppModule",
            path: ".",
            resources: [.copy("Golden")]
        ),
    ]
)
#else
let package = Package(name: "EmbeddingDemoApp")
#endif
