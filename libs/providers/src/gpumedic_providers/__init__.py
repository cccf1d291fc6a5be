"""Where workers are rented: one interface (`base.Provider`), a simulated provider for the
simulated fleet and tests (`sim`), and RunPod's documented REST API (`runpod`)."""
