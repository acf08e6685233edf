"""The FeatureSpec path: IDs enter the host key stage straight from the dataset."""
