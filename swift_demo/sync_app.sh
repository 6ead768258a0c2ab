#!/bin/sh
# Copies what the iPad app package needs into it, as plain files (Swift Playgrounds takes no local package
# dependency, and a symlink dangles once the folder is copied to an iPad or into the app bundle):
#   Sources/EmbeddingKit, Sources/EmbeddingKitApple -> EmbeddingDemoApp.swiftpm/EmbeddingKit, .../EmbeddingKitApple
#   Tests/EmbeddingKitTests/Fixtures                -> EmbeddingDemoApp.swiftpm/Golden
# Run it after editing either library or after `make swift-fixtures`; `swift test` (AppPackageTests) fails while
# a copy differs. Usage: swift_demo/sync_app.sh (from anywhere).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
app="$here/EmbeddingDemoApp.swiftpm"
copy() {
    rm -rf "$app/$2.tmp"
    mkdir -p "$app/$2.tmp"
    cp -R "$here/$1/." "$app/$2.tmp/"
    rm -rf "$app/$2"
    mv "$app/$2.tmp" "$app/$2"
}
copy Sources/EmbeddingKit EmbeddingKit
copy Sources/EmbeddingKitApple EmbeddingKitApple
copy Tests/EmbeddingKitTests/Fixtures Golden
echo "synced EmbeddingKit, EmbeddingKitApple and Golden into $app"
