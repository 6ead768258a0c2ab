// The camera's pure side: how a back-camera frame must be turned for the way the iPad is held, and what the Live
// screen says for each camera permission. The Apple layer maps UIDeviceOrientation and AVAuthorizationStatus onto
// these by raw value and name.

import Foundation

public enum BackCamera {
    /// UIDeviceOrientation's raw values (UIKit: unknown 0, portrait 1, portraitUpsideDown 2, landscapeLeft 3,
    /// landscapeRight 4, faceUp 5, faceDown 6).
    public enum Hold: Int, CaseIterable, Sendable {
        case portrait = 1, portraitUpsideDown, landscapeLeft, landscapeRight
    }

    /// A capture output's frames are in the sensor's orientation, AVCaptureVideoOrientation.landscapeRight (the
    /// device's bottom edge on the right): upright when the device is held in UIDeviceOrientation.landscapeLeft, and
    /// each other hold a quarter turn more. nil (face up, face down, unknown): keep the last one.
    public static func frameOrientation(deviceOrientation raw: Int) -> ExifOrientation? {
        switch Hold(rawValue: raw) {
        case .landscapeLeft: return .up
        case .portrait: return .right  // a quarter turn clockwise
        case .landscapeRight: return .down
        case .portraitUpsideDown: return .left
        case nil: return nil
        }
    }

    /// AVCaptureConnection.videoRotationAngle for the preview: the same turn in degrees clockwise.
    public static func previewRotationAngle(deviceOrientation raw: Int) -> Double? {
        switch frameOrientation(deviceOrientation: raw) {
        case .up: return 0
        case .right: return 90
        case .down: return 180
        case .left: return 270
        default: return nil
        }
    }
}

/// AVAuthorizationStatus, by name.
public enum CameraAccess: String, Sendable {
    case notDetermined, authorized, denied, restricted

    /// What the Live screen shows instead of the camera; nil when it can start (or ask).
    public var blockedMessage: String? {
        switch self {
        case .notDetermined, .authorized: return nil
        case .denied: return "Camera access is off for this app. Turn it on in Settings to classify what the camera sees."
        case .restricted: return "The camera is restricted on this device (Screen Time or a profile): this app cannot ask for it."
        }
    }

    /// The Settings button helps only where the user can turn the camera on.
    public var settingsCanHelp: Bool { self == .denied }
}
