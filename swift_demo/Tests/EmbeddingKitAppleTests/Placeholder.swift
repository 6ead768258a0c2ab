// Core ML tests: see CoreMLEncoderTests.swift (#if canImport(CoreML)).
