// Where Core ML puts the model, shown rather than assumed. A model loaded for `.cpuAndNeuralEngine` still "runs" when
// the Neural Engine takes none of its operations (they fall back to the CPU silently), so the compute unit the model
// loaded with proves nothing. MLComputePlan (iOS 17.4+) says, per operation, which unit Core ML plans to use; the
// Apple layer reads it into OpPlacement rows, and the counting here is plain Swift.

import Foundation

/// The compute units to ask Core ML for, best first. A choice that fails to load (swift-chat#31: "Failed to build
/// the model execution plan ... error code: -14" on the Neural Engine) falls back to the next, ending on the CPU.
public enum ComputeChoice: String, CaseIterable, Sendable {
    case all, cpuAndNeuralEngine, cpuAndGPU, cpuOnly

    /// `self`, then every choice after it, ending with the CPU (which always exists).
    public var fallbacks: [ComputeChoice] { Array(Self.allCases.drop { $0 != self }) }
}

public enum ComputeUnitKind: String, CaseIterable, Sendable {
    case neuralEngine = "Neural Engine", gpu = "GPU", cpu = "CPU"
}

/// One operation of the model as the compute plan describes it.
public struct OpPlacement: Equatable, Sendable {
    public let op: String
    /// nil: Core ML dispatches it to no unit (constants).
    public let preferred: ComputeUnitKind?
    public let supported: [ComputeUnitKind]
    /// Its share of the model's estimated cost (MLComputePlan.Cost.weight), when the plan gives one.
    public let cost: Double?

    public init(op: String, preferred: ComputeUnitKind?, supported: [ComputeUnitKind] = [], cost: Double? = nil) {
        self.op = op
        self.preferred = preferred
        self.supported = supported
        self.cost = cost
    }
}

public struct ComputePlanSummary: Equatable, Sendable {
    public struct Share: Equatable, Sendable {
        public let unit: ComputeUnitKind
        public let ops: Int
        /// Of the dispatched operations.
        public let fractionOfOps: Double
        /// Of the estimated cost of the dispatched operations; nil when the plan gave no costs.
        public let fractionOfCost: Double?
    }

    public let dispatched: Int
    public let notDispatched: Int
    public struct OffNeuralEngine: Equatable, Sendable {
        public let op: String
        public let count: Int
        /// The plan lists the Neural Engine among the units that could run it.
        public let neuralEngineSupported: Bool
    }

    public let shares: [Share]  // every unit, in ComputeUnitKind order
    /// Operation types planned on another unit, most frequent first.
    public let offNeuralEngine: [OffNeuralEngine]

    public init(_ ops: [OpPlacement]) {
        let placed = ops.filter { $0.preferred != nil }
        let costs = placed.compactMap(\.cost)
        let totalCost = costs.reduce(0, +)
        dispatched = placed.count
        notDispatched = ops.count - placed.count
        shares = ComputeUnitKind.allCases.map { unit in
            let on = placed.filter { $0.preferred == unit }
            return Share(unit: unit, ops: on.count, fractionOfOps: placed.isEmpty ? 0 : Double(on.count) / Double(placed.count),
                         fractionOfCost: costs.isEmpty || totalCost <= 0 ? nil : on.compactMap(\.cost).reduce(0, +) / totalCost)
        }
        var counts: [String: (Int, Bool)] = [:]
        for o in placed where o.preferred != .neuralEngine {
            let c = counts[o.op] ?? (0, false)
            counts[o.op] = (c.0 + 1, c.1 || o.supported.contains(.neuralEngine))
        }
        offNeuralEngine = counts.map { OffNeuralEngine(op: $0.key, count: $0.value.0, neuralEngineSupported: $0.value.1) }
            .sorted { $0.count > $1.count || ($0.count == $1.count && $0.op < $1.op) }
    }

    public func share(_ unit: ComputeUnitKind) -> Share { shares.first { $0.unit == unit }! }

    /// What the diagnostics show, one line each.
    public var lines: [String] {
        let per = shares.map { s in
            "\(s.unit.rawValue) \(s.ops) (\(Self.percent(s.fractionOfOps))" + (s.fractionOfCost.map { ", \(Self.percent($0)) of the cost" } ?? "") + ")"
        }
        var out = ["operations planned: \(dispatched) — " + per.joined(separator: ", ") + (notDispatched > 0 ? "; \(notDispatched) constants not dispatched" : "")]
        if !offNeuralEngine.isEmpty {
            out.append("off the Neural Engine: " + offNeuralEngine.map { "\($0.op) ×\($0.count)" + ($0.neuralEngineSupported ? " (it could run there)" : "") }
                .joined(separator: ", "))
        }
        return out
    }

    static func percent(_ f: Double) -> String { String(format: "%.0f %%", 100 * f) }

    /// Shown where MLComputePlan does not exist: the app does not guess.
    public static let unavailable = "this system cannot report where each operation runs (MLComputePlan needs iPadOS 17.4 / macOS 14.4): whether the Neural Engine is used is unknown"
}
