// Core ML / Vision / camera: see the other files (each is #if canImport(CoreML)).
